#!/usr/bin/env bash
# tidy: `go mod tidy` in every module of the workspace (go.work: the library
# at the root, cmd/, examples/, inbox/franz/, internal/tests/ and
# outboxtest/).
#
# `go mod tidy` ignores go.work, and the nested modules require the library
# (cmd/ also inbox/franz/) at a version that may not be published yet (the
# placeholder v0.0.0-00010101000000-000000000000 before the first tag), so
# each nested module is tidied on a copy of its go.mod that replaces the
# library and every other module of the workspace with this checkout's
# directories; the replaces never reach the committed go.mod. A nested
# go.mod must have no replace directive at all: `go install …@latest`
# refuses a module that has one.
#
# Usage: scripts/tidy.sh [-check]
#   -check  change nothing; fail when a go.mod or go.sum is not tidy or a
#           nested go.mod has a replace directive (CI runs this)
# Needs the Go module proxy (or a module cache holding the dependencies).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root_module=github.com/gorm-outbox/outbox
repo=$(pwd)
check=0
case ${1:-} in
-check) check=1 ;;
"") ;;
*)
	echo "usage: scripts/tidy.sh [-check]" >&2
	exit 2
	;;
esac

export GOWORK=off GOFLAGS=-mod=mod
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0

# The library: its go.mod is what importers read.
if ((check)); then
	if ! go mod tidy -diff; then
		echo "tidy: the library module (go.mod, go.sum) is not tidy: run scripts/tidy.sh" >&2
		rc=1
	fi
else
	go mod tidy
fi

# The nested modules, as go.work lists them, and each one's module path.
dirs=()
mods=()
for dir in $(GOWORK='' go work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p'); do
	[[ $dir != . ]] || continue
	dirs+=("${dir#./}")
	mods+=("$(awk '$1 == "module" { print $2; exit }' "${dir#./}/go.mod")")
done
for i in "${!dirs[@]}"; do
	dir=${dirs[$i]}
	if go mod edit -json "$dir/go.mod" | grep -q '"Replace": \[' ; then
		echo "tidy: $dir/go.mod has a replace directive: go install of its commands would fail; require $root_module at a version instead (go.work points it at this checkout)" >&2
		rc=1
		continue
	fi
	# The library and the other nested modules, from this checkout.
	replaces=("-replace=$root_module=$repo")
	drops=("-dropreplace=$root_module")
	for j in "${!dirs[@]}"; do
		((j != i)) || continue
		replaces+=("-replace=${mods[$j]}=$repo/${dirs[$j]}")
		drops+=("-dropreplace=${mods[$j]}")
	done
	work="$tmp/$dir"
	mkdir -p "$work"
	cp "$dir/go.mod" "$work/go.mod"
	[[ ! -e $dir/go.sum ]] || cp "$dir/go.sum" "$work/go.sum"
	(
		cd "$dir"
		go mod edit -modfile="$work/go.mod" "${replaces[@]}"
		go mod tidy -modfile="$work/go.mod"
		go mod edit -modfile="$work/go.mod" "${drops[@]}"
	)
	for f in go.mod go.sum; do
		if ! cmp -s "$work/$f" "$dir/$f" 2>/dev/null; then
			if ((check)); then
				echo "tidy: $dir/$f is not tidy: run scripts/tidy.sh" >&2
				diff -u "$dir/$f" "$work/$f" >&2 || true
				rc=1
			else
				cp "$work/$f" "$dir/$f"
				echo "tidy: updated $dir/$f"
			fi
		fi
	done
done
exit "$rc"
