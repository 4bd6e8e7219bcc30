#!/bin/sh
# A python3 whose torch says it is 2.11, for the conformance rows of torch 2.x's worker variables
# (PYTHON_EXEC=this): the agent asks the workers' interpreter for torch/version.py's __version__
# (`python -c <probe>`, the probe naming find_spec); everything else is python3 itself.
case "$1 $2" in
  "-c "*find_spec*) echo "2.11.0+cu130"; exit 0 ;;
esac
exec /usr/bin/python3 "$@"
