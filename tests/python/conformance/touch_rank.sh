#!/bin/sh
# Conformance worker for --no_python (no interpreter): writes $1/<RANK> and says so on stdout.
set -e
echo "creating $1/$RANK"
printf 'RANK=%s\nLOCAL_RANK=%s\nLOCAL_WORLD_SIZE=%s\nWORLD_SIZE=%s\nROLE_NAME=%s\nargv=%s\n' \
  "$RANK" "$LOCAL_RANK" "$LOCAL_WORLD_SIZE" "$WORLD_SIZE" "$ROLE_NAME" "$*" > "$1/$RANK.tmp"
mv "$1/$RANK.tmp" "$1/$RANK"
