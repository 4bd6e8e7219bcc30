#!/usr/bin/env bash
# The Debian package as a user gets it: made from the build in BUILD_DIR with cpack, checked by
# lintian (no errors), unpacked into a scratch root, and used from there: both programs'
# --version, a launch of TEST_WORKER by the unpacked ctrun, the man pages and bash completion,
# and the consumer project built against the unpacked CMake package (consumer.sh).
# Usage: deb.sh BUILD_DIR SCRATCH_DIR TEST_WORKER [CXX_FLAGS [PREFIX_PATH]]
# Exits 77 (skipped) where dpkg-deb or lintian is not installed.
set -euo pipefail
build_dir="$1"
scratch="$2"
test_worker="$3"
here="$(cd "$(dirname "$0")" && pwd)"
for tool in dpkg-deb lintian; do
  if ! command -v "$tool" > /dev/null; then
    echo "SKIPPED: $tool is not installed (scripts/setup.sh --tests installs it)"
    exit 77
  fi
done
rm -rf "$scratch"
mkdir -p "$scratch"
fail() { echo "deb.sh: $*" >&2; exit 1; }

(cd "$build_dir" && cpack -G DEB -B "$scratch/out") > "$scratch/cpack.log" 2>&1 ||
  { cat "$scratch/cpack.log"; fail "cpack failed"; }
debs=("$scratch"/out/*.deb)
[ ${#debs[@]} -eq 1 ] && [ -f "${debs[0]}" ] || fail "expected one .deb in $scratch/out"
deb="${debs[0]}"
echo "package: $(basename "$deb"), $(du -h "$deb" | cut -f1)"
dpkg-deb --field "$deb"

# lintian: errors fail the test; warnings are listed.
lintian --fail-on error "$deb" > "$scratch/lintian.log" 2>&1 ||
  { cat "$scratch/lintian.log"; fail "lintian reports errors"; }
cat "$scratch/lintian.log"

root="$scratch/root"
dpkg-deb -x "$deb" "$root"
for f in usr/bin/ctrun usr/bin/ctrund usr/share/man/man1/ctrun.1.gz usr/share/man/man1/ctrund.1.gz \
         usr/share/bash-completion/completions/ctrun usr/share/bash-completion/completions/ctrund \
         usr/lib/systemd/system/ctrund.service usr/share/doc/ctrun/copyright \
         usr/share/doc/ctrun/changelog.gz usr/lib/cmake/ctrun/ctrunConfig.cmake \
         usr/include/ctrun/rendezvous/client.h usr/include/ctrun/worker/fault_tolerance.h; do
  [ -e "$root/$f" ] || fail "the package has no /$f"
done
# Outputs are read whole before they are searched: `producer | grep -q` fails now and then under
# pipefail, when grep has matched and gone before the producer's last write (SIGPIPE).
has() { grep -qE -- "$2" <<< "$1"; }
control=$(dpkg-deb --ctrl-tarfile "$deb" | tar -t)
has "$control" 'postinst' || fail "no postinst in the package: $control"

version=$("$root/usr/bin/ctrun" --version)
has "$version" '^ctrun [0-9.]+ \(revision [0-9a-f]+' || fail "ctrun --version: $version"
version=$("$root/usr/bin/ctrund" --version)
has "$version" '^ctrund [0-9.]+ \(revision [0-9a-f]+' || fail "ctrund --version: $version"
has "$(zcat "$root/usr/share/man/man1/ctrun.1.gz")" 'nproc' || fail "ctrun(1) lists no --nproc_per_node"
has "$(zcat "$root/usr/share/man/man1/ctrund.1.gz")" 'state' || fail "ctrund(1) lists no --state_dir"

# A launch with the unpacked ctrun: two workers, each says hello.
"$root/usr/bin/ctrun" --standalone --nproc_per_node=2 "$test_worker" print > "$scratch/launch.log" 2>&1 ||
  { cat "$scratch/launch.log"; fail "the unpacked ctrun could not launch"; }
for rank in 0 1; do
  grep -q "hello from $rank" "$scratch/launch.log" || { cat "$scratch/launch.log"; fail "no rank $rank"; }
done

# Completion offers ctrun's long options, read from the unpacked ctrun's --help.
completed=$(PATH="$root/usr/bin:$PATH" bash -c '
  source "$1"
  COMP_WORDS=(ctrun --nproc_per); COMP_CWORD=1
  _ctrun_complete
  printf "%s\n" "${COMPREPLY[@]}"' _ "$root/usr/share/bash-completion/completions/ctrun")
grep -qx -- '--nproc_per_node' <<< "$completed" || fail "completion of --nproc_per gave: $completed"

# The consumer project against the unpacked package. Its headers and CMake files are those of
# `cmake --install` byte for byte (package/find_package_consumer, run.sh, compiles each header
# alone there); its link takes the package's own libraries.
cmake --install "$build_dir" --prefix "$scratch/installed" > "$scratch/install.log"
for dir in include lib/cmake; do
  diff -r "$scratch/installed/$dir" "$root/usr/$dir" ||
    fail "the package's /usr/$dir differs from what cmake --install puts there"
done
bash "$here/consumer.sh" "$root/usr" "$scratch/consumer" "${4:-}" "${5:-}"
rm -rf "$scratch"
echo "deb.sh: the package is good"
