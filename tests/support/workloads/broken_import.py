"""A training script that cannot start: it imports a module the image does not have, the
way a trainer fails when its image lacks a dependency (the crash-loop tests)."""

import stabletrain_missing_helpers  # type: ignore[import-not-found]  # noqa: F401
