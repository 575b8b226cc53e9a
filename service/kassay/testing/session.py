"""What the pytest plugin sets for a session (kassay.testing.plugin) and assert_kernel reads:
the device, whether cases are timed, and who hears of every case asserted (the session's
report). Torch-free: the plugin loads in every pytest run where kassay is installed, the API's
torch-free install included."""

from __future__ import annotations

from typing import Any

SESSION: dict[str, Any] = {"device": "auto", "timing": False, "record": None}
