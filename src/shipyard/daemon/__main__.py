import sys

from shipyard.daemon.loop import main

sys.exit(main())
