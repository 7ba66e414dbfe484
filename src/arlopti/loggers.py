"""Lightning loggers with this project's defaults, for the ``logger=`` group (configs/logger/).

``tensorboard`` and ``csv`` are Lightning's ``TensorBoardLogger`` / ``CSVLogger`` as they are;
``wandb`` and ``mlflow`` are Lightning's ``WandbLogger`` / ``MLFlowLogger`` built by the two
factories below, which only settle two things first:

* :func:`wandb_logger`: online or offline (:func:`wandb_offline`): ``offline: auto`` (the
  default) is offline when there is no network or no W&B credentials, so a run on an offline
  node never blocks on W&B; an offline run is written under ``<run dir>/wandb/offline-run-*`` and
  uploaded later with ``wandb sync <that folder>``.
* :func:`mlflow_logger`: a local file store, ``file:<run dir>/mlruns``. MLflow ≥ 3.7 refuses the
  file store unless ``MLFLOW_ALLOW_FILE_STORE=true``; the factory sets it (only for ``file:``
  URIs, only when unset). Browse with ``mlflow ui --backend-store-uri file:<run dir>/mlruns``.

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
                  reachable: Callable[[str], bool]) -> tuple[bool, str]:
    """(offline?, why). ``offline`` true/false decides. ``"auto"``: ``WANDB_MODE`` decides when set
    (``offline`` / ``dryrun`` / ``disabled`` → offline, else online); otherwise offline without W&B
    credentials (``WANDB_API_KEY`` or a ``wandb login``), or when the W&B host
    (``WANDB_BASE_URL``, default the public one) does not answer (``reachable``)."""
    if isinstance(offline, bool):
        return offline, f"logger.wandb.offline={str(offline).lower()}"
    if offline != "auto":
        raise ValueError(f"logger.wandb.offline={offline!r}: use true, false or auto")
    mode = env.get("WANDB_MODE")
    if mode:
        return mode in ("offline", "dryrun", "disabled"), f"WANDB_MODE={mode}"
    if not has_credentials:
        return True, "no W&B credentials (WANDB_API_KEY or `wandb login`)"
    host = env.get("WANDB_BASE_URL", WANDB_DEFAULT_HOST)
    if not reachable(host):
        return True, f"{host} is not reachable"
    return False, f"{host} is reachable and credentials are set"


def _wandb_has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import netrc

        return netrc.netrc().authenticators(urlparse(os.environ.get("WANDB_BASE_URL", WANDB_DEFAULT_HOST))
                                            .hostname or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_logger(offline: bool | str = "auto", **kwargs):
    """Lightning's ``WandbLogger(offline=..., **kwargs)`` with ``offline`` settled by
    :func:`wandb_offline` (logged at INFO with the reason)."""
    _require("wandb", "wandb")
    from lightning.pytorch.loggers import WandbLogger

    off, why = wandb_offline(offline, os.environ, _wandb_has_credentials(), _reachable)
    log.info("wandb: %s (%s)%s", "offline" if off else "online", why,
             "; upload later with `wandb sync <run dir>/wandb/offline-run-*`" if off else "")
    if off:
        os.environ.setdefault("WANDB_MODE", "offline")
    logger = WandbLogger(offline=off, **kwargs)
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

    if not str(tracking_uri).startswith("file:"):
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


def file_store_names(keys: list[str], renamed: set[str]) -> dict[str, str]:
    """``{key: name}`` for an MLflow file store: ``key + "/all"`` for a key that is a ``/``-prefix
    of another key of the same call or was renamed before (``renamed`` is updated), else ``key``."""
    prefixes = {k.rsplit("/", i)[0] for k in keys for i in range(1, k.count("/") + 1)}
    renamed.update(k for k in keys if k in prefixes)
    return {k: f"{k}/all" if k in renamed else k for k in keys}
