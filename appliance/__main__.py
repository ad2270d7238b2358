"""`python -m appliance` runs the same command line as the `appliance` console script."""

import sys

from appliance.cli import main

sys.exit(main())
