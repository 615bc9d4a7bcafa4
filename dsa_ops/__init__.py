"""dsa-ops: the DSA sparse-indexer top-k as torch.library custom ops.

``import dsa_ops`` needs torch only; optional backends import their dependencies lazily.
"""

from dsa_ops import ops  # noqa: F401  (registers the generic ops)
from dsa_ops import backends  # the package is callable: dsa_ops.backends() -> mapping
from dsa_ops.backends import Backend, Support, load_builtin

load_builtin()

from dsa_ops import policy  # noqa: E402
from dsa_ops.api import topk_decode, topk_prefill  # noqa: E402

__version__ = "0.1.0"
__all__ = ["topk_decode", "topk_prefill", "backends", "policy", "Backend", "Support", "__version__"]
