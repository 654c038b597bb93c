#!/usr/bin/env bash
# Stages other branches' builds for one GPU call that compares them with this one
# (`AB_LIBS="TAG=DEST/TAG ..." scripts/gpu_session.sh ... ab`):
#
#   scripts/stage_branches.sh BUILD_DIR DEST TAG=BRANCH[:full] ...
#
# Checks each branch out in turn in this worktree and rebuilds BUILD_DIR (only what differs
# recompiles), then stages its libraggedattn.so, compressed, in DEST/TAG (`:full`: the command and
# the GPU tests too, for a branch whose tests differ; run those with DEST/TAG as the build).
# Returns to the starting branch and rebuilds it. Needs a clean worktree.
set -eu
build=$1 dest=$2
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "stage_branches.sh: the worktree has uncommitted changes; commit or stash them first" >&2
  exit 2
fi
start=$(git symbolic-ref --short -q HEAD || git rev-parse HEAD)
# This branch's stager, not each branch's own (older branches may lack its options).
stager=$(mktemp)
cp "$repo/scripts/stage_build.sh" "$stager"
trap 'rm -f "$stager"; git checkout -q "$start" && ninja -C "$build" >/dev/null' EXIT
for spec in "$@"; do
  tag=${spec%%=*}
  branch=${spec#*=}
  mode=--lib-only
  case $branch in *:full) branch=${branch%:full}; mode= ;; esac
  git checkout -q "$branch"
  echo "== $tag: $branch ($(git rev-parse --short HEAD))"
  if [ -z "$mode" ]; then
    ninja -C "$build" >/dev/null
  else
    ninja -C "$build" src/libraggedattn.so >/dev/null
  fi
  bash "$stager" "$build" "$dest/$tag" $mode --xz
  git rev-parse HEAD >"$dest/$tag/COMMIT"
done
