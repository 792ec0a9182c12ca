#!/usr/bin/env bash
# readme-recipes: the README's install recipes, run as a newcomer runs them.
# A recipe is a ```sh block of README.md right after a line
# `<!-- recipe NAME -->`; each runs verbatim (bash -euo pipefail) in a new
# directory next to a checkout of REV at ../gorm-outbox (git archive: the
# committed files, go.work included), with GOWORK=off, GOFLAGS empty (no
# -mod=mod: a missing `go mod tidy` fails as it would for the newcomer) and
# no module source but the module proxy: GOPROXY without its `direct`
# fallback. The first recipe starts in an empty directory; each later one in
# a copy of the first one's module (its go.mod, go.sum and .go files), as
# the README says. Each recipe's output is shown; the script fails naming
# every recipe that failed, or when README.md has none.
#
# Usage: scripts/readme-recipes.sh [REV]   (default: HEAD)
# Needs git, the Go module proxy (or a module cache holding the
# dependencies) and a Kafka broker for the README's example:
# KAFKA_BROKERS, else OUTBOX_TEST_KAFKA_BROKERS (scripts/services.sh env).
# It uses the caller's module and build caches: with a cold build cache it
# compiles GORM, kafka-go, the cgo SQLite driver and the worker's
# dependencies (minutes on 2 cores); with a warm one it takes seconds.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
rev=${1:-HEAD}

brokers=${KAFKA_BROKERS:-${OUTBOX_TEST_KAFKA_BROKERS:-}}
if [[ -z $brokers ]]; then
	echo "readme-recipes: no Kafka broker for the README's example: set KAFKA_BROKERS or OUTBOX_TEST_KAFKA_BROKERS (eval \"\$(scripts/services.sh env)\")" >&2
	exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/readme-recipes.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The recipes of README.md at $rev, one file each, in README order.
names=()
git show "$rev:README.md" | awk -v dir="$tmp" '
	match($0, /^<!-- recipe [a-z0-9-]+ -->$/) { name = $3; want = 1; next }
	want && /^```sh$/ { out = dir "/" name ".sh"; print name; want = 0; next }
	want { print "!" name; want = 0 }
	out && /^```$/ { close(out); out = ""; next }
	out { print > out; next }
' >"$tmp/names"
mapfile -t names <"$tmp/names"
if grep -q '^!' "$tmp/names"; then
	echo "readme-recipes: README.md at $rev: no \`\`\`sh block right after <!-- recipe $(sed -n 's/^!//p' "$tmp/names" | head -n1) -->" >&2
	exit 1
fi
if ((${#names[@]} == 0)); then
	echo "readme-recipes: README.md at $rev has no recipe (a \`\`\`sh block right after <!-- recipe NAME -->)" >&2
	exit 1
fi

mkdir "$tmp/gorm-outbox"
git archive "$rev" | tar -x -C "$tmp/gorm-outbox"

proxy=$(go env GOPROXY | sed -E 's/[,|]direct$//')
export GOWORK=off GOFLAGS='' GOPROXY=$proxy KAFKA_BROKERS=$brokers
echo "readme-recipes: ${#names[@]} recipes of README.md at $rev (${names[*]}), GOPROXY=$GOPROXY, KAFKA_BROKERS=$KAFKA_BROKERS"

failed=()
t_all=$SECONDS
for i in "${!names[@]}"; do
	name=${names[$i]} dir=$tmp/${names[$i]} t0=$SECONDS rc=0
	mkdir "$dir"
	if ((i > 0)); then
		if ((${#failed[@]} > 0)) && [[ ${failed[0]} == "${names[0]}" ]]; then
			echo "readme-recipes: --- $name: not run (it starts from ${names[0]}'s module)"
			failed+=("$name")
			continue
		fi
		cp "$tmp/${names[0]}"/go.mod "$tmp/${names[0]}"/go.sum "$tmp/${names[0]}"/*.go "$dir/"
	fi
	echo "readme-recipes: === $name (in a new directory next to ../gorm-outbox$( ((i > 0)) && echo ", from ${names[0]}'s module"))"
	(cd "$dir" && bash -euo pipefail "$tmp/$name.sh") 2>&1 | sed "s/^/  $name| /" || rc=$?
	if ((rc == 0)); then
		echo "readme-recipes: --- $name: OK ($((SECONDS - t0))s)"
	else
		echo "readme-recipes: --- $name: FAILED (exit $rc, $((SECONDS - t0))s)"
		failed+=("$name")
	fi
done
if ((${#failed[@]} > 0)); then
	echo "readme-recipes: FAILED: ${failed[*]} ($((SECONDS - t_all))s)" >&2
	exit 1
fi
echo "readme-recipes: OK: ${names[*]} ($((SECONDS - t_all))s)"
