"""arc-rec for verl: arc-rec's pass@k estimators registered with verl, and ``compute_score``
answered by arc-rec's own graders (``arc-rec grade serve``). See docs/SCALE-OUT.md.

Importing this package registers the estimators when verl is importable, which is what verl's
``VERL_USE_EXTERNAL_MODULES=arc_rec_verl`` does inside its Ray workers.
"""

from . import estimators

try:  # pragma: no cover - depends on what is installed
    import verl.trainer.ppo.core_algos  # noqa: F401
except ImportError:
    REGISTERED: list[str] = []
else:
    REGISTERED = estimators.register()

__all__ = ["estimators", "REGISTERED"]
