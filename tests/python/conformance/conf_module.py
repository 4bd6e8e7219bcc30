"""Conformance module for `-m conf_module` (the directory is on PYTHONPATH): the touch_rank worker
run as a module."""
from touch_rank import main

if __name__ == "__main__":
    main()
