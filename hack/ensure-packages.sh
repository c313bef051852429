#!/usr/bin/env bash
# Installs the Debian packages that provide what is missing, and nothing when everything is there:
#
#   hack/ensure-packages.sh NEED=PACKAGE...
#
# NEED is a command looked up on PATH, or an absolute path that must exist (a library). Packages
# come from the machine's apt repositories only; without apt-get it names them and fails.
set -euo pipefail

missing=()
for pair in "$@"; do
	need=${pair%%=*} package=${pair#*=}
	if [[ $need == /* ]]; then
		[[ -e $need ]] || missing+=("$package")
	else
		command -v "$need" >/dev/null 2>&1 || missing+=("$package")
	fi
done
((${#missing[@]} == 0)) && exit 0

mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
if ! command -v apt-get >/dev/null 2>&1; then
	echo "ensure-packages.sh: missing ${packages[*]} and no apt-get to install them; install them by hand" >&2
	exit 1
fi
sudo=()
((EUID == 0)) || sudo=(sudo)
echo "ensure-packages.sh: installing ${packages[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
