"""``python -m cosmos_reason_ros.bench``: the ``bench`` command."""

import sys

from cosmos_reason_ros.bench.runner import main

sys.exit(main())
