"""``python -m verl_bridge.doctor [OPTIONS]``: the same as ``verl-bridge doctor [OPTIONS]``."""

import sys

from verl_bridge.cli import main

if __name__ == "__main__":
    sys.exit(main(["doctor", *sys.argv[1:]]))
