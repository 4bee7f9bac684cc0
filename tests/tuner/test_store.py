"""The kernel-config store: records, lookups, concurrency, bad files, export/import."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from cswap.tuner.store import (
    SCHEMA_VERSION,
    ConfigStore,
    Evaluation,
    LookupResult,
    StoreError,
    TuningRun,
    fingerprint_key,
    scale_grid_params,
    size_bucket,
)

H100 = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "sm_count": 132,
        "memory_bytes": 85_000_000_000, "driver": "12040", "cuda": "12.4"}
H100_OTHER_DRIVER = {**H100, "driver": "12080"}
A100 = {"kind": "cuda", "name": "NVIDIA A100-SXM4-40GB", "compute_capability": "8.0", "sm_count": 108,
        "memory_bytes": 42_000_000_000, "driver": "12040", "cuda": "12.4"}
L4 = {"kind": "cuda", "name": "NVIDIA L4", "compute_capability": "8.9", "sm_count": 58,
      "memory_bytes": 24_000_000_000, "driver": "12040", "cuda": "12.4"}
CPU = {"kind": "cpu", "name": "AMD EPYC", "compute_capability": "", "sm_count": 2, "memory_bytes": 8 << 30}

KERNEL, SOURCE, DTYPE, BUCKET = "zvc.cuda.compress", "src-1", "float32", 12
GRID = {"compress_grid": 264, "compress_block": 256, "chunk_words": 32}


def make_run(fp=H100, params=GRID, time_s=1e-3, **overrides) -> TuningRun:
    fields = dict(
        fingerprint=fp, kernel=KERNEL, source_hash=SOURCE, dtype=DTYPE, bucket=BUCKET, method="bo",
        best_params=params, best_time_s=time_s,
        evaluations=(Evaluation({**params, "compress_block": 32}, 2 * time_s), Evaluation(params, time_s),
                     Evaluation({**params, "compress_block": 1024}, math.inf)),
        wall_s=1.5,
    )
    fields.update(overrides)
    return TuningRun(**fields)


@pytest.fixture
def store(tmp_path: Path) -> ConfigStore:
    with ConfigStore(tmp_path / "store.db") as s:
        yield s


# ----------------------------------------------------------------------------- size buckets and keys


@pytest.mark.parametrize(
    "nbytes, bucket",
    [(-5, 0), (0, 0), (1, 0), (3, 0), (4, 1), (15, 1), (16, 2), (1 << 20, 10), ((1 << 20) + 1, 10),
     (16 << 20, 12), ((16 << 20) - 1, 11), (1 << 40, 20), (np.int64(64), 3)],
)
def test_size_bucket_is_floor_log4(nbytes: int, bucket: int) -> None:
    assert size_bucket(nbytes) == bucket


def test_size_bucket_rejects_non_integers() -> None:
    with pytest.raises(TypeError, match="byte count"):
        size_bucket(1.5)


def test_fingerprint_key_matches_device_fingerprint() -> None:
    from cswap.device import DeviceFingerprint, fingerprint

    for fp in (fingerprint("cpu"), DeviceFingerprint(**H100), DeviceFingerprint(**CPU)):
        assert fingerprint_key(fp.to_dict()) == fp.key
        assert fingerprint_key(fp) == fp.key


def test_device_fingerprint_objects_are_accepted(store: ConfigStore) -> None:
    from cswap.device import DeviceFingerprint

    fp = DeviceFingerprint(**A100)
    assert store.add_device(fp) == fp.key
    assert store.record_run(make_run(fp=fp))
    assert store.lookup(fp, KERNEL, SOURCE, DTYPE, BUCKET).match == "exact"


def test_default_path_is_under_cswap_home() -> None:
    with ConfigStore() as s:
        assert s.path == Path(os.environ["CSWAP_HOME"]) / "store.db"
        assert s.path.exists()
        assert s.schema_version == SCHEMA_VERSION


def test_wal_mode(store: ConfigStore) -> None:
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


# ----------------------------------------------------------------------------- runs and best configs


def test_record_and_read_back_a_run(store: ConfigStore) -> None:
    run = make_run()
    assert store.record_run(run) is True
    assert store.run(run.run_id) == run
    assert store.run(run.run_id).evaluations[2].failed
    assert store.best(fingerprint_key(H100), KERNEL, SOURCE, DTYPE, BUCKET) == (GRID, 1e-3)


def test_recording_the_same_run_id_twice_is_a_no_op(store: ConfigStore) -> None:
    run = make_run()
    assert store.record_run(run)
    faster_same_id = make_run(run_id=run.run_id, time_s=1e-6, params={**GRID, "compress_grid": 1})
    assert store.record_run(faster_same_id) is False
    assert store.best(fingerprint_key(H100), KERNEL, SOURCE, DTYPE, BUCKET) == (GRID, 1e-3)
    assert len(store.runs()) == 1
    assert len(store.run(run.run_id).evaluations) == 3


@pytest.mark.parametrize("second_time_s, expect_second", [(5e-4, True), (2e-3, False), (1e-3, False)])
def test_best_config_is_replaced_only_by_a_faster_one(store: ConfigStore, second_time_s: float, expect_second: bool) -> None:
    other = {**GRID, "compress_grid": 528}
    store.record_run(make_run())
    store.record_run(make_run(params=other, time_s=second_time_s))
    expected = (other, second_time_s) if expect_second else (GRID, 1e-3)
    assert store.best(fingerprint_key(H100), KERNEL, SOURCE, DTYPE, BUCKET) == expected
    assert len(store.runs()) == 2


def test_a_run_where_every_config_failed_stores_no_best(store: ConfigStore) -> None:
    run = make_run(time_s=math.inf, evaluations=(Evaluation(GRID, math.inf),))
    assert store.record_run(run)
    assert store.best(fingerprint_key(H100), KERNEL, SOURCE, DTYPE, BUCKET) is None
    assert store.run(run.run_id).best_time_s == math.inf


def test_numpy_integers_from_the_optimizer_become_ints(store: ConfigStore) -> None:
    params = {"compress_grid": np.int64(96), "compress_block": np.int32(128)}
    run = make_run(params=params, time_s=np.float64(2e-4), evaluations=(Evaluation(params, np.float32(2e-4)),))
    store.record_run(run)
    stored, time_s = store.best(fingerprint_key(H100), KERNEL, SOURCE, DTYPE, BUCKET)
    assert stored == {"compress_grid": 96, "compress_block": 128}
    assert all(type(v) is int for v in stored.values())
    assert time_s == pytest.approx(2e-4)


def test_runs_filters_and_evaluations(store: ConfigStore) -> None:
    store.record_run(make_run(created_at=1.0))
    store.record_run(make_run(created_at=2.0, kernel="zvc.cuda.decompress"))
    store.record_run(make_run(fp=A100, created_at=3.0))
    assert [r.created_at for r in store.runs()] == [1.0, 2.0, 3.0]
    assert [r.kernel for r in store.runs(fingerprint_key(H100))] == [KERNEL, "zvc.cuda.decompress"]
    assert [r.fingerprint["name"] for r in store.runs(kernel=KERNEL)] == [H100["name"], A100["name"]]
    assert store.runs(fingerprint_key(A100), "zvc.cuda.decompress") == []
    assert all(r.evaluations == () for r in store.runs())
    assert all(len(r.evaluations) == 3 for r in store.runs(with_evaluations=True))
    assert [r.created_at for r in store.runs(limit=1, offset=1)] == [2.0]
    assert store.run("no-such-run") is None


def test_devices_and_counts(store: ConfigStore) -> None:
    assert store.devices() == []
    key = store.add_device(CPU)
    assert store.add_device(CPU) == key
    store.record_run(make_run())
    store.record_run(make_run(kernel="zvc.cuda.decompress"))
    store.put_model(H100, "compress_time", {"coef": [1.0, 2.0]})
    by_key = {d["key"]: d for d in store.devices()}
    assert by_key[key] == {"key": key, "fingerprint": CPU | {"driver": "", "cuda": ""}, "configs": 0, "runs": 0, "models": 0}
    h100 = by_key[fingerprint_key(H100)]
    assert (h100["configs"], h100["runs"], h100["models"]) == (2, 2, 1)
    assert h100["fingerprint"] == H100
    assert store.resolve_key(key[:6]) == key
    assert store.resolve_key("zz") is None


# ----------------------------------------------------------------------------- lookup


def test_lookup_exact(store: ConfigStore) -> None:
    store.record_run(make_run())
    store.record_run(make_run(fp=H100_OTHER_DRIVER, params={**GRID, "compress_grid": 1}, time_s=1e-6))
    result = store.lookup(H100, KERNEL, SOURCE, DTYPE, BUCKET)
    assert result == LookupResult(GRID, 1e-3, "exact", fingerprint_key(H100))


def test_lookup_same_model_prefers_the_fastest(store: ConfigStore) -> None:
    store.record_run(make_run(fp=H100_OTHER_DRIVER, time_s=3e-3))
    store.record_run(make_run(fp={**H100, "driver": "1"}, params={**GRID, "compress_grid": 500}, time_s=2e-3))
    store.record_run(make_run(fp=A100, time_s=1e-9))
    result = store.lookup(H100, KERNEL, SOURCE, DTYPE, BUCKET)
    assert result.match == "same-model"
    assert result.params == {**GRID, "compress_grid": 500}
    assert result.source_key == fingerprint_key({**H100, "driver": "1"})
    assert result.warm_start == ()


def test_lookup_transfers_from_the_nearest_device_scaling_grids(store: ConfigStore) -> None:
    store.record_run(make_run(fp=A100, params={**GRID, "compress_grid": 216}, time_s=1e-3))
    store.record_run(make_run(fp=L4, params={**GRID, "compress_grid": 116}, time_s=2e-3))
    store.record_run(make_run(fp=CPU, params={"threads": 2, "chunk_words": 32}, time_s=1e-4))
    result = store.lookup(H100, KERNEL, SOURCE, DTYPE, BUCKET)
    assert result.match == "transferred"
    assert result.source_key == fingerprint_key(A100)
    assert result.params == {"compress_grid": round(216 * 132 / 108), "compress_block": 256, "chunk_words": 32}
    assert result.time_s == 1e-3
    assert result.warm_start[0] == result.params
    assert {**GRID, "compress_grid": round(116 * 132 / 58)} in result.warm_start  # the L4's best, scaled
    assert {"compress_grid": round(216 * 132 / 108), "compress_block": 32, "chunk_words": 32} in result.warm_start
    assert all(p.keys() == GRID.keys() for p in result.warm_start)  # never the CPU's config
    assert len(result.warm_start) == len({json.dumps(p, sort_keys=True) for p in result.warm_start})


def test_transfer_ties_on_sm_count_break_by_memory(store: ConfigStore) -> None:
    near = {**A100, "name": "near", "memory_bytes": H100["memory_bytes"] - 1}
    far = {**A100, "name": "far", "memory_bytes": 1}
    store.record_run(make_run(fp=far, time_s=1e-6))
    store.record_run(make_run(fp=near, time_s=1e-3))
    assert store.lookup(H100, KERNEL, SOURCE, DTYPE, BUCKET).source_key == fingerprint_key(near)


@pytest.mark.parametrize("ratio_fp, expected_grid", [({**H100, "sm_count": 1}, 1), ({**H100, "sm_count": 1 << 20}, 65535)])
def test_transferred_grids_are_clamped(store: ConfigStore, ratio_fp: dict, expected_grid: int) -> None:
    store.record_run(make_run(fp=A100, params={**GRID, "compress_grid": 50}))
    assert store.lookup(ratio_fp, KERNEL, SOURCE, DTYPE, BUCKET).params["compress_grid"] == expected_grid


def test_scale_grid_params_only_touches_grids() -> None:
    assert scale_grid_params({"a_grid": 10, "a_block": 10, "threads": 3}, 2.5) == {"a_grid": 25, "a_block": 10, "threads": 3}


@pytest.mark.parametrize(
    "field, value",
    [("source_hash", "src-2"), ("kernel", "zvc.cuda.decompress"), ("dtype", "bfloat16"), ("bucket", 11)],
)
def test_lookup_never_returns_a_config_for_something_else(store: ConfigStore, field: str, value: object) -> None:
    for fp in (H100, H100_OTHER_DRIVER, A100):
        store.record_run(make_run(fp=fp, **{field: value}))
    result = store.lookup(H100, KERNEL, SOURCE, DTYPE, BUCKET, default={"compress_grid": 7})
    assert result == LookupResult({"compress_grid": 7}, None, "default", None)


def test_lookup_does_not_transfer_across_kinds(store: ConfigStore) -> None:
    store.record_run(make_run(fp=H100))
    assert store.lookup(CPU, KERNEL, SOURCE, DTYPE, BUCKET).match == "default"
    assert store.lookup(CPU, KERNEL, SOURCE, DTYPE, BUCKET).params is None


def test_lookup_by_partial_fields(store: ConfigStore) -> None:
    store.record_run(make_run(fp=H100_OTHER_DRIVER))
    model_only = store.lookup_by(KERNEL, SOURCE, DTYPE, BUCKET, key="unknown", kind="cuda", name=H100["name"],
                                 compute_capability="9.0", sm_count=132)
    assert model_only.match == "same-model"
    kind_only = store.lookup_by(KERNEL, SOURCE, DTYPE, BUCKET, kind="cuda", sm_count=66)
    assert kind_only.match == "transferred" and kind_only.params["compress_grid"] == 132
    assert store.lookup_by(KERNEL, SOURCE, DTYPE, BUCKET, key=fingerprint_key(H100_OTHER_DRIVER)).match == "exact"
    assert store.lookup_by(KERNEL, SOURCE, DTYPE, BUCKET).match == "default"


# ----------------------------------------------------------------------------- models


def test_models_round_trip_and_replace(store: ConfigStore) -> None:
    store.put_model(H100, "compress_time", {"coef": [1.5, 2.0], "intercept": 0.1})
    store.put_model(H100, "compress_time", {"coef": [3.0], "intercept": 0.0})
    store.put_model(H100, "classifier", {"threshold": 0.5})
    assert store.models(fingerprint_key(H100)) == {
        "classifier": {"threshold": 0.5}, "compress_time": {"coef": [3.0], "intercept": 0.0}
    }
    assert store.models("unknown") == {}


@pytest.mark.parametrize("model, match", [({"coef": math.nan}, "not JSON-serialisable"),
                                          ({"coef": np.zeros(2)}, "tolist"), ([1, 2], "must be a dict")])
def test_models_must_be_json(store: ConfigStore, model: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        store.put_model(H100, "m", model)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"best_time_s": math.nan}, "best_time_s is NaN"),
        ({"best_time_s": -1.0}, "best_time_s is -1.0, must be >= 0"),
        ({"best_params": {"compress_grid": 1.5}}, r"best_params\['compress_grid'\] must be an integer"),
        ({"best_params": [1, 2]}, "best_params must be a dict"),
        ({"bucket": 64}, "bucket is 64, must be between 0 and 63"),
        ({"bucket": -1}, "bucket is -1"),
        ({"fingerprint": {"kind": "cuda"}}, "fingerprint is missing name, compute_capability, sm_count, memory_bytes"),
        ({"fingerprint": {**H100, "sm_count": "132"}}, "fingerprint sm_count must be an integer"),
        ({"kernel": "zvc\ud800"}, "kernel is not valid Unicode"),
        ({"kernel": ""}, "kernel must be a non-empty string"),
        ({"wall_s": math.inf}, "wall_s is infinite"),
        ({"evaluations": ({"params": GRID, "time_s": math.nan},)}, "evaluation time_s is NaN"),
        ({"evaluations": "abc"}, "evaluations must be a sequence"),
    ],
)
def test_bad_runs_are_rejected_naming_the_field(overrides: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_run(**overrides)


def test_run_dict_round_trip_keeps_infinities() -> None:
    run = make_run()
    data = json.loads(json.dumps(run.to_dict(), allow_nan=False))
    assert data["evaluations"][2]["time_s"] is None
    assert TuningRun.from_dict(data) == run
    with pytest.raises(ValueError, match="unknown fields colour"):
        TuningRun.from_dict({**data, "colour": "red"})
    with pytest.raises(ValueError, match="missing kernel"):
        TuningRun.from_dict({k: v for k, v in data.items() if k != "kernel"})


def test_record_run_takes_only_runs(store: ConfigStore) -> None:
    with pytest.raises(TypeError, match="takes a TuningRun"):
        store.record_run(make_run().to_dict())


# ----------------------------------------------------------------------------- export / import


def test_export_import_round_trip(store: ConfigStore, tmp_path: Path) -> None:
    store.record_run(make_run())
    store.record_run(make_run(fp=A100, time_s=math.inf, evaluations=()))
    store.add_device(CPU)
    store.put_model(L4, "compress_time", {"coef": [1.0]})
    exported = json.loads(json.dumps(store.export_json(), allow_nan=False))
    with ConfigStore(tmp_path / "copy.db") as copy:
        assert copy.import_json(exported) == {"devices": 4, "runs": 2, "configs": 1, "models": 1}
        assert copy.import_json(exported) == {"devices": 0, "runs": 0, "configs": 0, "models": 0}
        again = copy.export_json()
        for doc in (again, exported):
            doc.pop("exported_at")
        assert again == exported
        assert copy.devices() == store.devices()


def test_import_keeps_the_faster_best(store: ConfigStore, tmp_path: Path) -> None:
    store.record_run(make_run(time_s=1e-3))
    with ConfigStore(tmp_path / "other.db") as other:
        other.record_run(make_run(time_s=5e-4, params={**GRID, "compress_grid": 999}))
        assert other.import_json(store.export_json())["runs"] == 1
        assert other.best(fingerprint_key(H100), KERNEL, SOURCE, DTYPE, BUCKET)[1] == 5e-4
        assert store.import_json(other.export_json())["configs"] == 1
        assert store.best(fingerprint_key(H100), KERNEL, SOURCE, DTYPE, BUCKET) == ({**GRID, "compress_grid": 999}, 5e-4)


@pytest.mark.parametrize(
    "doc, match",
    [
        ({"devices": []}, "not a cswap store export"),
        ({"format": "cswap-config-store", "schema_version": 99}, "schema_version 99"),
        ({"format": "cswap-config-store", "schema_version": 1, "runs": {}}, "'runs' must be a list"),
        ({"format": "cswap-config-store", "schema_version": 1, "runs": [{"kernel": "x"}]}, r"runs\[0\]: tuning run is missing"),
    ],
)
def test_import_rejects_bad_documents_and_imports_nothing(store: ConfigStore, doc: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        store.import_json(doc)
    assert store.devices() == []


def test_a_failed_import_rolls_back(store: ConfigStore) -> None:
    doc = {"format": "cswap-config-store", "schema_version": 1, "devices": [H100], "runs": [make_run().to_dict()],
           "models": [{"device_key": "0000000000000000", "name": "m", "model": {}}]}
    with pytest.raises(ValueError, match="unknown device 0000000000000000"):
        store.import_json(doc)
    assert store.devices() == [] and store.runs() == []


# ----------------------------------------------------------------------------- bad files


def test_a_corrupt_file_raises_and_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    junk = np.random.default_rng(0).integers(0, 256, 8192, dtype=np.uint8).tobytes()
    path.write_bytes(junk)
    with pytest.raises(StoreError, match=rf"{path}.*not a readable cswap store.*move it aside"):
        ConfigStore(path)
    assert path.read_bytes() == junk
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store.db"]


def test_another_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a cswap store.*customers"):
        ConfigStore(path)


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    ConfigStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}, newer.*Upgrade cswap"):
        ConfigStore(path)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory"):
        ConfigStore(tmp_path)


def test_a_locked_store_raises_then_recovers_losing_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = ConfigStore(path, timeout_s=0.2)
    first = make_run()
    store.record_run(first)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match=rf"{path} is locked.*Wait for that process"):
            store.record_run(make_run())
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    second = make_run()
    assert store.record_run(second)
    assert {r.run_id for r in store.runs()} == {first.run_id, second.run_id}
    store.close()


# ----------------------------------------------------------------------------- concurrency


def _record_many(path: str | ConfigStore, worker: int, count: int) -> None:
    store = path if isinstance(path, ConfigStore) else ConfigStore(path)
    for index in range(count):
        time_s = 1e-3 + worker * 1e-5 + index * 1e-7
        store.record_run(make_run(run_id=f"w{worker}-{index}", time_s=time_s,
                                  params={**GRID, "compress_grid": worker * 1000 + index}))
        if index % 5 == 0:
            store.lookup(H100, KERNEL, SOURCE, DTYPE, BUCKET)
    store.close()


def test_concurrent_processes_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    workers, count = 4, 25
    ctx = multiprocessing.get_context("spawn")
    processes = [ctx.Process(target=_record_many, args=(path if w % 2 else ConfigStore(path), w, count))
                 for w in range(workers)]  # half get the path, half a pickled store
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
    assert [p.exitcode for p in processes] == [0] * workers
    with ConfigStore(path) as store:
        runs = store.runs(with_evaluations=True)
        assert {r.run_id for r in runs} == {f"w{w}-{i}" for w in range(workers) for i in range(count)}
        assert all(len(r.evaluations) == 3 for r in runs)
        assert store.best(fingerprint_key(H100), KERNEL, SOURCE, DTYPE, BUCKET) == ({**GRID, "compress_grid": 0}, 1e-3)


def test_concurrent_threads_share_one_store(store: ConfigStore) -> None:
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for index in range(10):
                store.record_run(make_run(run_id=f"t{worker}-{index}"))
                store.lookup(H100, KERNEL, SOURCE, DTYPE, BUCKET)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.runs()) == 80


def _record_in_child(store: ConfigStore, run_id: str) -> None:
    store.record_run(make_run(run_id=run_id))
    store.close()


def test_a_forked_child_opens_its_own_connection(store: ConfigStore) -> None:
    store.record_run(make_run(run_id="parent-before"))
    child = multiprocessing.get_context("fork").Process(target=_record_in_child, args=(store, "child"))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    store.record_run(make_run(run_id="parent-after"))  # the parent's connection still works
    assert {r.run_id for r in store.runs()} == {"parent-before", "child", "parent-after"}


# ----------------------------------------------------------------------------- read-only stores


def test_a_read_only_store_lists_and_reads_but_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with ConfigStore(path) as writable:
        writable.record_run(make_run())
        expected_devices, expected_runs = writable.devices(), writable.runs(with_evaluations=True)
    before = path.read_bytes()
    with ConfigStore(path, read_only=True) as store:
        assert store.read_only
        assert store.devices() == expected_devices
        assert store.runs(with_evaluations=True) == expected_runs
        assert store.lookup(H100, KERNEL, SOURCE, DTYPE, BUCKET).match == "exact"
        assert store.export_json()["runs"] == [run.to_dict() for run in expected_runs]
        for write in (lambda: store.record_run(make_run(fp=A100)), lambda: store.add_device(CPU),
                      lambda: store.put_model(H100, "m", {}), lambda: store.import_json(store.export_json())):
            with pytest.raises(StoreError, match=rf"{path} is read-only.*point cswap at a writable store.*CSWAP_HOME"):
                write()
    assert path.read_bytes() == before


def test_opening_a_store_takes_no_write_lock(tmp_path: Path) -> None:
    """Another process holding the write lock (a running `cswap tune`) does not stop a reader from opening."""
    path = tmp_path / "store.db"
    ConfigStore(path).record_run(make_run())
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        with ConfigStore(path, timeout_s=0.1) as store:
            assert [d["key"] for d in store.devices()] == [fingerprint_key(H100)]
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_a_missing_store_cannot_be_opened_read_only(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist, so it cannot be opened read-only"):
        ConfigStore(tmp_path / "absent.db", read_only=True)
    assert not (tmp_path / "absent.db").exists()


def test_a_run_answered_with_its_device_key_reads_back() -> None:
    run = make_run()
    assert TuningRun.from_dict({**run.to_dict(), "fingerprint_key": run.fingerprint_key}) == run
    with pytest.raises(ValueError, match="fingerprint_key 'ffff' but its fingerprint's key is"):
        TuningRun.from_dict({**run.to_dict(), "fingerprint_key": "ffff"})
    assert run.model_dump(mode="json")["fingerprint_key"] == fingerprint_key(H100)
