#!/usr/bin/env bash
# install-check: `go install github.com/gorm-outbox/outbox/cmd/outbox-relay@latest`
# as a user runs it, against a module proxy in a temporary directory that
# serves a commit as its tags would publish it:
#   - the cmd module (cmd/ of the commit) at v0.0.1, so that @latest
#     resolves to it;
#   - the library (the commit without its nested modules, as the go command
#     zips it) at the version cmd/go.mod requires (the placeholder until the
#     first release, then the library's tag);
#   - the other nested modules cmd/go.mod requires (inbox/franz, for the
#     chaos harness's consumer processes), from their directories, at the
#     versions it requires.
# Every other module comes from the local module cache or GOPROXY. This
# proves that the worker installs outside the workspace: cmd/go.mod has no
# replace, requires what the worker compiles, and the library's module
# alone (no cmd/, no examples/, no go.work) provides every package it
# imports.
#
# Usage: scripts/install-check.sh [REV]   (default: HEAD; committed files only)
# Needs git, and the Go module proxy or a module cache holding the
# dependencies. Builds in a temporary module cache: a minute or two.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
rev=${1:-HEAD}
root_module=github.com/gorm-outbox/outbox
cmd_version=v0.0.1

tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null || true; rm -rf "$tmp"' EXIT
proxy=$tmp/proxy

git show "$rev:cmd/go.mod" >"$tmp/cmd.mod"
lib_version=$(GOWORK=off go mod edit -json "$tmp/cmd.mod" | grep -A1 -F "\"Path\": \"$root_module\"" | sed -n 's/.*"Version": "\(.*\)".*/\1/p')
if [[ -z $lib_version ]]; then
	echo "install-check: cmd/go.mod at $rev does not require $root_module" >&2
	exit 1
fi

# publish MODULE VERSION DIR: the module in DIR of $rev (. for the root),
# without the nested modules below it, in the proxy's layout.
publish() {
	local mod=$1 ver=$2 dir=$3 d="$proxy/$1/@v" exclude=() n
	mkdir -p "$d"
	for n in $(git ls-tree -r --name-only "$rev" | sed -n 's#/go\.mod$##p'); do
		if [[ $dir == . && $n != . ]] || [[ $n == "$dir"/* ]]; then
			exclude+=(":(exclude)$n")
		fi
	done
	exclude+=(":(exclude)go.work" ":(exclude)go.work.sum")
	if [[ $dir == . ]]; then
		git archive --format=zip --prefix="$mod@$ver/" -o "$d/$ver.zip" "$rev" -- . "${exclude[@]}"
		git show "$rev:go.mod" >"$d/$ver.mod"
	else
		git archive --format=zip --prefix="$mod@$ver/" -o "$d/$ver.zip" "$rev:$dir"
		git show "$rev:$dir/go.mod" >"$d/$ver.mod"
	fi
	printf '{"Version":"%s","Time":"2000-01-01T00:00:00Z"}\n' "$ver" >"$d/$ver.info"
	echo "$ver" >>"$d/list"
}
publish "$root_module" "$lib_version" .
publish "$root_module/cmd" "$cmd_version" cmd
for n in $(git ls-tree -r --name-only "$rev" | sed -n 's#/go\.mod$##p'); do
	[[ $n != cmd ]] || continue
	v=$(GOWORK=off go mod edit -json "$tmp/cmd.mod" | { grep -A1 -F "\"Path\": \"$root_module/$n\"" || true; } | sed -n 's/.*"Version": "\(.*\)".*/\1/p')
	[[ -z $v ]] || publish "$root_module/$n" "$v" "$n"
done

real_cache=$(go env GOMODCACHE)
upstream=$(go env GOPROXY)
echo "install-check: go install $root_module/cmd/outbox-relay@latest (cmd $cmd_version and the library at $lib_version from $rev)"
(
	cd "$tmp"
	GOWORK=off GOFLAGS=-modcacherw GOMODCACHE="$tmp/modcache" GOBIN="$tmp/bin" \
		GOPROXY="file://$proxy,file://$real_cache/cache/download,$upstream" \
		GONOSUMDB="$root_module" \
		go install "$root_module/cmd/outbox-relay@latest"
)
# The usage is captured before it is matched: with pipefail, `-h | grep -q`
# fails whenever grep exits at the first line while the worker still writes
# (SIGPIPE), about one run in 40.
usage=$("$tmp/bin/outbox-relay" -h 2>&1 || true)
if ! grep -q '^Usage: outbox-relay' <<<"$usage"; then
	echo "install-check: the installed outbox-relay does not print its usage" >&2
	exit 1
fi
echo "install-check: OK ($(du -h "$tmp/bin/outbox-relay" | cut -f1) binary)"
