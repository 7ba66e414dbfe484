"""The ``logger=`` group: one smoke training with every logger at once (TensorBoard, CSV, wandb
offline, MLflow file store), each logger's own files holding the core scalars, the sample
completions and the config; wandb's offline decision; each logger config composes alone."""

from __future__ import annotations

import csv
import glob
import json
import struct

import pytest

from arlopti.loggers.factories import wandb_offline
from helpers.compose import compose_train

CORE = ("reward/mean", "update/loss")


def wandb_history_keys(run_file: str) -> dict[str, list[float]]:
    """``{key: values}`` of the history records of an offline ``run-*.wandb`` file. The file is a
    LevelDB-style log (wandb's ``datastore``): a 7-byte header, then 32 KiB blocks of chunks, each
    ``crc32 (4) | length (2) | type (1)`` with type 1 full, 2 first, 3 middle, 4 last; each record
    is a ``wandb_internal_pb2.Record`` protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(run_file, "rb").read()
    block, pos, buf, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            pos += left - 7
            continue
        chunk, pos = data[pos:pos + length], pos + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            records.append(buf + chunk)
    out: dict[str, list[float]] = {}
    for raw in records:
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                out.setdefault(key, []).append(json.loads(item.value_json))
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    import wandb

    from arlopti.entry.train import train

    out = tmp_path_factory.mktemp("loggers")
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")  # what an offline node has; `offline: auto` follows it
    mp.setenv("WANDB_SILENT", "true")
    try:
        cfg = compose_train(["experiment=kk_grpo", "debug=smoke", "data=kk_generated", "data.train_count_per_n=4",
                             "data.val_count_per_n=1", "logger=many_loggers", "~callbacks.benchmark_eval"], out)
        train(cfg)
        wandb.finish()
    finally:
        mp.undo()
    return out


def test_csv_holds_scalars_samples_and_config(run_dir):
    rows = [r for r in csv.DictReader(open(run_dir / "csv" / "metrics.csv")) if r["reward/mean"]]
    assert [r["step"] for r in rows] == ["1", "2"] and all(r[k] for r in rows for k in CORE)
    samples = [json.loads(line) for line in open(run_dir / "csv" / "samples.jsonl")]
    assert {s["step"] for s in samples} == {1, 2}
    assert set(samples[0]) == {"step", "index", "reward", "prompt", "response"}
    assert "algorithm" in (run_dir / "csv" / "config.yaml").read_text()
    assert (run_dir / "csv" / "hparams.yaml").is_file()


def test_tensorboard_holds_scalars_samples_and_config(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert set(CORE) <= set(acc.Tags()["scalars"])
    assert {"samples/0/text_summary", "config/text_summary"} <= set(acc.Tags()["tensors"])


def test_mlflow_file_store_holds_scalars_samples_and_config(run_dir):
    (run,) = [p for p in glob.glob(str(run_dir / "mlruns" / "*" / "*")) if glob.glob(p + "/metrics")]
    for tag in CORE:
        lines = open(f"{run}/metrics/{tag}").read().split("\n")
        assert [ln.split()[2] for ln in lines if ln] == ["1", "2"]  # "<timestamp> <value> <step>"
    samples = [json.loads(line) for line in open(f"{run}/artifacts/samples/step_000001.jsonl")]
    assert samples and samples[0]["step"] == 1 and isinstance(samples[0]["response"], str)
    assert "algorithm" in open(f"{run}/artifacts/config.yaml").read()
    assert glob.glob(f"{run}/params/run/algorithm/*") or glob.glob(f"{run}/params/*")


def test_wandb_offline_run_holds_scalars_samples_and_config(run_dir):
    (folder,) = glob.glob(str(run_dir / "wandb" / "offline-run-*"))
    history = wandb_history_keys(glob.glob(folder + "/run-*.wandb")[0])
    for tag in CORE:
        assert len(history[tag]) == 2, tag
    tables = glob.glob(folder + "/files/media/table/samples_*.table.json")
    assert len(tables) == 2
    table = json.load(open(tables[0]))
    assert table["columns"] == ["step", "index", "reward", "prompt", "response"] and table["data"]
    assert "algorithm" in open(folder + "/files/hydra_config.yaml").read()


def test_wandb_offline_decision():
    never = lambda url: pytest.fail("no network check expected")  # noqa: E731
    assert wandb_offline("auto", {"WANDB_MODE": "offline"}, True, never) == (True, "WANDB_MODE=offline")
    assert wandb_offline("auto", {"WANDB_MODE": "online"}, False, never)[0] is False
    assert wandb_offline("auto", {}, False, never)[0] is True  # no credentials: offline
    assert wandb_offline("auto", {}, True, lambda url: False) == (True, "https://api.wandb.ai is not reachable")
    assert wandb_offline("auto", {"WANDB_BASE_URL": "http://w:8080"}, True, lambda url: url == "http://w:8080")[0] is False
    assert wandb_offline(True, {}, True, never)[0] is True and wandb_offline(False, {}, False, never)[0] is False
    with pytest.raises(ValueError, match="logger.wandb.offline='yes'"):
        wandb_offline("yes", {}, True, never)


@pytest.mark.parametrize("name", ["tensorboard", "csv", "wandb", "mlflow", "many_loggers", "[csv,mlflow]"])
def test_each_logger_config_composes(name, tmp_path):
    cfg = compose_train([f"logger={name}"], tmp_path)
    expected = {"many_loggers": {"tensorboard", "csv", "wandb", "mlflow"}, "[csv,mlflow]": {"csv", "mlflow"}}
    assert set(cfg.logger) == expected.get(name, {name})
    if name == "mlflow":
        assert cfg.logger.mlflow.tracking_uri == f"file:{tmp_path}/mlruns"


def test_mlflow_file_store_names_a_metric_that_is_also_a_folder():
    from arlopti.loggers.factories import file_store_names

    renamed: set[str] = set()
    assert file_store_names(["m/x", "m/x/0.00-0.25", "reward/mean"], renamed) == {
        "m/x": "m/x/all", "m/x/0.00-0.25": "m/x/0.00-0.25", "reward/mean": "reward/mean"}
    assert file_store_names(["m/x"], renamed) == {"m/x": "m/x/all"}  # renamed for good


# ---- start-up checks against the host each logger will really use (issue 24, §2) ---------------


def _free_loopback_port() -> int:
    """A localhost port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wandb_probes_its_own_base_url_and_falls_back_offline_when_the_host_is_not_wandb(tmp_path, monkeypatch,
                                                                                           caplog):
    """A loopback HTTP server that accepts TCP and answers 404 to everything, named only in wandb's
    own settings file (no WANDB_BASE_URL): the probe checks that host, not api.wandb.ai; the
    reachability check passes, wandb.init fails (CommError), and the logger is offline with the
    reason logged."""
    pytest.importorskip("wandb")
    import http.server
    import logging
    import socketserver
    import threading

    import wandb

    from arlopti.loggers.factories import wandb_base_url, wandb_logger

    class NotWandb(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b"not W&B")

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, *args):
            pass

    server = socketserver.TCPServer(("127.0.0.1", 0), NotWandb)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        config_dir = tmp_path / "wandb_config"
        config_dir.mkdir()
        (config_dir / "settings").write_text(f"[default]\nbase_url = {url}\n")
        for k, v in {"WANDB_CONFIG_DIR": str(config_dir), "WANDB_API_KEY": "a" * 40, "WANDB_DIR": str(tmp_path),
                     "WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false"}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("WANDB_MODE", raising=False)
        monkeypatch.delenv("WANDB_BASE_URL", raising=False)
        wandb.teardown()  # settings are read once per process: re-read them from this environment
        assert wandb_base_url() == url
        with caplog.at_level(logging.WARNING, logger="arlopti.loggers.factories"):
            logger = wandb_logger(offline="auto", save_dir=str(tmp_path), project="p")
        assert logger._offline is True
        assert f"could not start an online run at {url} (CommError" in caplog.text
        assert "logging offline instead" in caplog.text
    finally:
        server.shutdown()
        monkeypatch.undo()
        wandb.teardown()


def test_mlflow_tracking_server_down_is_refused_at_start_up_naming_the_uri(tmp_path):
    """logger.mlflow.tracking_uri=http://127.0.0.1:<closed port> through train.py: exit status 1
    within seconds, the message naming the URI (MLflow alone retries for minutes)."""
    pytest.importorskip("mlflow")
    from test_clear_failures import run_train_cli

    uri = f"http://127.0.0.1:{_free_loopback_port()}"
    code, err = run_train_cli(tmp_path, "logger=mlflow", f"logger.mlflow.tracking_uri={uri}")
    assert code == 1
    assert f"logger.mlflow.tracking_uri={uri}: no MLflow tracking server answers there" in err


def test_mlflow_new_experiment_warning_is_dropped(caplog):
    import logging

    from arlopti.loggers.factories import _quiet_new_experiment

    _quiet_new_experiment()
    _quiet_new_experiment()  # idempotent: one filter
    mlflow_log = logging.getLogger("lightning.pytorch.loggers.mlflow")
    assert sum(type(f).__name__ == "_NewExperimentFilter" for f in mlflow_log.filters) == 1
    with caplog.at_level(logging.WARNING, logger="lightning.pytorch.loggers.mlflow"):
        mlflow_log.warning("Experiment with name kk not found. Creating it.")
        mlflow_log.warning("something else")
    assert "Creating it" not in caplog.text and "something else" in caplog.text
