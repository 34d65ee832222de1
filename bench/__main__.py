"""``python -m bench``: run every measurement, write bench/results.md and bench/lag.png.

python -m bench                      # the full run (make bench), under 10 minutes
python -m bench --quick              # a short run for development
python -m bench --only fire,burst --backends sqlite,redis --quick
"""

from __future__ import annotations

from .run import main

if __name__ == "__main__":
    main()
