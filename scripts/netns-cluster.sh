#!/usr/bin/env bash
# A cluster of N hosts on one machine, for multi-node tests: network namespaces node0..nodeN-1,
# each with loopback and one interface (eth0) on a private test range (198.18.0.0/24, RFC 2544
# benchmarking addresses), joined by a bridge that lives in its own namespace (ctrun-switch).
# Nothing is created in, or routed to, the machine's own network namespace.
#
#   scripts/netns-cluster.sh up N [--prefix P]    create (again, if it exists) N nodes
#   scripts/netns-cluster.sh down [--prefix P]    remove every namespace of the cluster
#   scripts/netns-cluster.sh addr I               print node I's address
#
# Run a command on a node with `ip netns exec [P]nodeI COMMAND`. --prefix P names the namespaces
# P-node0.., P-switch, so that several clusters (parallel tests) can exist at once.
# Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN).
set -euo pipefail

usage() {
  echo "usage: $0 up N [--prefix P] | down [--prefix P] | addr I" >&2
  exit 2
}

node_addr() { echo "198.18.0.$((10 + $1))"; }

[ $# -ge 1 ] || usage
command=$1
shift
count=""
if [ "$command" = up ] || [ "$command" = addr ]; then
  [ $# -ge 1 ] || usage
  count=$1
  shift
  [[ "$count" =~ ^[0-9]+$ ]] || { echo "$0: '$count' is not a number" >&2; exit 2; }
fi
prefix=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix)
      [ $# -ge 2 ] || usage
      [[ "$2" =~ ^[A-Za-z0-9_]{1,8}$ ]] || { echo "$0: --prefix: 1-8 letters, digits or _, got '$2'" >&2; exit 2; }
      prefix="$2-"
      shift 2
      ;;
    *) usage ;;
  esac
done
switch="${prefix}switch"
[ -n "$prefix" ] || switch="ctrun-switch"

down() {
  local ns
  for ns in $(ip netns list | awk '{print $1}'); do
    if [ "$ns" = "$switch" ] || [[ "$ns" =~ ^${prefix}node[0-9]+$ ]]; then
      ip netns del "$ns"
    fi
  done
}

case "$command" in
  addr)
    node_addr "$count"
    ;;
  down)
    down
    ;;
  up)
    [ "$count" -ge 1 ] && [ "$count" -le 200 ] || { echo "$0: N must be 1..200" >&2; exit 2; }
    down
    ip netns add "$switch"
    ip -n "$switch" link set lo up
    ip -n "$switch" link add br0 type bridge
    ip -n "$switch" link set br0 up
    for ((i = 0; i < count; i++)); do
      ns="${prefix}node$i"
      ip netns add "$ns"
      ip -n "$ns" link set lo up
      # The pair is made inside the node, then one end is moved to the switch.
      ip -n "$ns" link add eth0 type veth peer name "port$i"
      ip -n "$ns" link set "port$i" netns "$switch"
      ip -n "$switch" link set "port$i" master br0
      ip -n "$switch" link set "port$i" up
      ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
      ip -n "$ns" link set eth0 up
    done
    ;;
  *) usage ;;
esac
