"""Lightning loggers with this project's defaults, for the ``logger=`` group (configs/logger/).

``tensorboard`` and ``csv`` are Lightning's ``TensorBoardLogger`` / ``CSVLogger`` as they are;
``wandb`` and ``mlflow`` are Lightning's ``WandbLogger`` / ``MLFlowLogger`` built by the two
factories below, which only settle two things first:

* :func:`wandb_logger`: online or offline (:func:`wandb_offline`): ``offline: auto`` (the
  default) is offline when there is no network or no W&B credentials, so a run on an offline
  node never blocks on W&B; an offline run is written under ``<run dir>/wandb/offline-run-*`` and
  uploaded later with ``wandb sync <that folder>``. The host probed is the one wandb will use,
  its settings' ``base_url`` (:func:`wandb_base_url`: ``WANDB_BASE_URL``, wandb's settings file,
  else wandb's own default, which is not ``api.wandb.ai`` in every version). A run that goes online
  starts its W&B run at once; if that fails for any reason (a host that accepts TCP but is not
  W&B answers 404, a rejected key) the logger falls back to offline and logs why.
* :func:`mlflow_logger`: a local file store, ``file:<run dir>/mlruns``. MLflow ≥ 3.7 refuses the
  file store unless ``MLFLOW_ALLOW_FILE_STORE=true``; the factory sets it (only for ``file:``
  URIs, only when unset). Browse with ``mlflow ui --backend-store-uri file:<run dir>/mlruns``.
  An ``http(s)`` tracking server is checked once at start-up (:func:`check_mlflow_server`, a TCP
  connection with a short timeout): a server that is down is an error naming the URI, not minutes
  of MLflow's retries.

Both packages are optional (``pip install -e ".[loggers]"``; the ``dev`` extra has them): a
missing one is an error naming the extra.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Callable, Mapping
from urllib.parse import urlparse

log = logging.getLogger(__name__)

WANDB_DEFAULT_HOST = "https://api.wandb.ai"


def _require(module: str, logger: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ImportError(f"logger={logger} needs the `{module}` package: pip install -e '.[loggers]' "
                          f"(or pip install {module if module != 'mlflow' else 'mlflow-skinny'})")


def _reachable(url: str, timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to ``url``'s host and port opens within ``timeout_s``."""
    u = urlparse(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wandb_offline(offline: bool | str, env: Mapping[str, str], has_credentials: bool,
                  reachable: Callable[[str], bool], host: str | None = None) -> tuple[bool, str]:
    """(offline?, why). ``offline`` true/false decides. ``"auto"``: ``WANDB_MODE`` decides when set
    (``offline`` / ``dryrun`` / ``disabled`` → offline, else online); otherwise offline without W&B
    credentials (``WANDB_API_KEY`` or a ``wandb login``), or when the W&B host does not answer
    (``reachable``). ``host``: the one wandb will use (:func:`wandb_base_url`); None reads
    ``WANDB_BASE_URL``, default the public one."""
    if isinstance(offline, bool):
        return offline, f"logger.wandb.offline={str(offline).lower()}"
    if offline != "auto":
        raise ValueError(f"logger.wandb.offline={offline!r}: use true, false or auto")
    mode = env.get("WANDB_MODE")
    if mode:
        return mode in ("offline", "dryrun", "disabled"), f"WANDB_MODE={mode}"
    if not has_credentials:
        return True, "no W&B credentials (WANDB_API_KEY or `wandb login`)"
    host = host or env.get("WANDB_BASE_URL", WANDB_DEFAULT_HOST)
    if not reachable(host):
        return True, f"{host} is not reachable"
    return False, f"{host} is reachable and credentials are set"


def wandb_base_url() -> str:
    """The host wandb will connect to: its global settings' ``base_url`` (``WANDB_BASE_URL``, the
    settings file, else the installed wandb's default); ``WANDB_BASE_URL`` or the public host if
    the settings cannot be read."""
    try:
        from wandb.sdk import wandb_setup

        return str(wandb_setup.singleton().settings.base_url)
    except Exception:  # noqa: BLE001 - an unexpected wandb version: the documented variable
        return os.environ.get("WANDB_BASE_URL", WANDB_DEFAULT_HOST)


def _wandb_has_credentials(host: str) -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import netrc

        return netrc.netrc().authenticators(urlparse(host).hostname or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_logger(offline: bool | str = "auto", **kwargs):
    """Lightning's ``WandbLogger(offline=..., **kwargs)`` with ``offline`` settled by
    :func:`wandb_offline` (logged at INFO with the reason); an online run is started here, and
    any failure to start it falls back to offline with the reason (a WARNING)."""
    _require("wandb", "wandb")
    host = wandb_base_url()
    off, why = wandb_offline(offline, os.environ, _wandb_has_credentials(host), _reachable, host)
    log.info("wandb: %s (%s)%s", "offline" if off else "online", why,
             "; upload later with `wandb sync <run dir>/wandb/offline-run-*`" if off else "")
    if off:
        os.environ.setdefault("WANDB_MODE", "offline")
        return _wandb(True, kwargs)
    try:
        logger = _wandb(False, kwargs)
        logger.experiment  # noqa: B018 - wandb.init now, while falling back is still possible
        return logger
    except Exception as err:  # noqa: BLE001 - any failure to go online: offline, with the reason
        log.warning("wandb: could not start an online run at %s (%s: %s); logging offline instead, upload later "
                    "with `wandb sync <run dir>/wandb/offline-run-*`", host, type(err).__name__, err)
        _finish_failed_wandb()
        os.environ["WANDB_MODE"] = "offline"
        return _wandb(True, kwargs)


def _finish_failed_wandb() -> None:
    try:
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=1)
    except Exception:  # noqa: BLE001 - nothing to finish
        pass


def _wandb(offline: bool, kwargs: dict):
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(offline=offline, **kwargs)
    # Lightning always passes wandb.init(anonymous=None), which recent wandb (0.31 here) warns about as deprecated
    # at every start; not passing the unset key silences that at its source.
    init = getattr(logger, "_wandb_init", None)
    if isinstance(init, dict) and init.get("anonymous") is None:
        init.pop("anonymous", None)
    return logger


def mlflow_logger(tracking_uri: str, **kwargs):
    """Lightning's ``MLFlowLogger(tracking_uri=..., **kwargs)``; for a ``file:`` store, sets
    ``MLFLOW_ALLOW_FILE_STORE=true`` unless already set (see the module docstring)."""
    _require("mlflow", "mlflow")
    from lightning.pytorch.loggers import MLFlowLogger

    _quiet_new_experiment()
    if not str(tracking_uri).startswith("file:"):
        check_mlflow_server(str(tracking_uri))
        return MLFlowLogger(tracking_uri=tracking_uri, **kwargs)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

    class FileStoreMLFlowLogger(MLFlowLogger):
        """A file store keeps metric ``a/b`` in the file ``metrics/a/b``, so ``a/b`` and ``a/b/c``
        cannot both exist (e.g. ``mismatch/abs_diff_max`` and its per-bucket
        ``mismatch/abs_diff_max/<b>``): a name that is a ``/``-prefix of another is logged as
        :func:`file_store_names` says, from then on."""

        _renamed: set = set()

        def log_metrics(self, metrics, step=None):
            names = file_store_names(list(metrics), self._renamed)
            super().log_metrics({names[k]: v for k, v in metrics.items()}, step=step)

    logger = FileStoreMLFlowLogger(tracking_uri=tracking_uri, **kwargs)
    logger._renamed = set()
    return logger


def check_mlflow_server(tracking_uri: str, timeout_s: float = 5.0,
                        reachable: Callable[[str, float], bool] | None = None) -> None:
    """Refuse an ``http(s)`` MLflow tracking server that does not accept a TCP connection within
    ``timeout_s`` (MLflow itself retries for minutes before failing). Other schemes (``databricks``,
    ``sqlite:``...) are not probed."""
    if urlparse(tracking_uri).scheme not in ("http", "https"):
        return
    if not (reachable or _reachable)(tracking_uri, timeout_s):
        raise ConnectionError(f"logger.mlflow.tracking_uri={tracking_uri}: no MLflow tracking server answers there "
                              f"(no TCP connection within {timeout_s:g} s). Start the server, fix the URI, or log "
                              "to a local store (the default, file:<run dir>/mlruns)")


class _NewExperimentFilter(logging.Filter):
    """Drops Lightning's "Experiment with name ... not found. Creating it." warning: a new run's
    experiment (a fresh ``file:`` store, a new ``task_name``) is created on purpose, not a fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "not found. Creating it." not in record.getMessage()


def _quiet_new_experiment() -> None:
    mlflow_log = logging.getLogger("lightning.pytorch.loggers.mlflow")
    if not any(isinstance(f, _NewExperimentFilter) for f in mlflow_log.filters):
        mlflow_log.addFilter(_NewExperimentFilter())


def file_store_names(keys: list[str], renamed: set[str]) -> dict[str, str]:
    """``{key: name}`` for an MLflow file store: ``key + "/all"`` for a key that is a ``/``-prefix
    of another key of the same call or was renamed before (``renamed`` is updated), else ``key``."""
    prefixes = {k.rsplit("/", i)[0] for k in keys for i in range(1, k.count("/") + 1)}
    renamed.update(k for k in keys if k in prefixes)
    return {k: f"{k}/all" if k in renamed else k for k in keys}
