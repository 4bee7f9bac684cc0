"""The kernel-config store's public face: every name callers import from ``cswap.tuner.store``.

The store is split by concern; this module re-exports their public names so that
``from cswap.tuner.store import ConfigStore, TuningRun`` keeps working:

* :mod:`cswap.tuner.records`: the validated records (:class:`TuningRun`, :class:`Evaluation`,
  :class:`LookupResult`) shared with the tuning service, and :func:`size_bucket`;
* :mod:`cswap.tuner.fingerprints`: :class:`Fingerprint`, :func:`normalize_fingerprint`, :func:`fingerprint_key`;
* :mod:`cswap.tuner.database`, :mod:`cswap.tuner.rows` and :mod:`cswap.tuner.configstore`: the SQLite
  file, its row writers and :class:`ConfigStore`;
* :mod:`cswap.tuner.validation`: the field checks behind the records;
* :mod:`cswap.tuner.transfer`: configs across devices (:func:`scale_grid_params`);
* :mod:`cswap.tuner.exchange`: the export/import document.

It imports neither torch nor the cswap runtime.

Example:
    >>> store = ConfigStore("/tmp/cswap-doc-store.db")
    >>> store.lookup({"kind": "cpu", "name": "x", "compute_capability": "", "sm_count": 2, "memory_bytes": 0},
    ...              "zvc.cpu.compress", "abc", "float32", size_bucket(1 << 20)).match
    'default'
"""

from cswap.tuner.configstore import ConfigStore
from cswap.tuner.database import SCHEMA_VERSION, StoreError
from cswap.tuner.exchange import EXPORT_FORMAT
from cswap.tuner.fingerprints import Fingerprint, FingerprintLike, fingerprint_key, normalize_fingerprint
from cswap.tuner.records import MATCHES, Evaluation, LookupResult, TuningRun, size_bucket
from cswap.tuner.transfer import scale_grid_params

__all__ = [
    "EXPORT_FORMAT",
    "MATCHES",
    "SCHEMA_VERSION",
    "ConfigStore",
    "Evaluation",
    "Fingerprint",
    "FingerprintLike",
    "LookupResult",
    "StoreError",
    "TuningRun",
    "fingerprint_key",
    "normalize_fingerprint",
    "scale_grid_params",
    "size_bucket",
]
