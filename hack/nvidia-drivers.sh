#!/usr/bin/env bash
# Fetches NVIDIA's real user-space NVML libraries (and nvidia-smi) of four driver branches from
# Debian's non-free packages into the project's cache, plus a glibc that is not the machine's
# (Debian 13's libc6) to play a host whose glibc differs from the image's. Prints the directory:
#
#   DIR/<version>/libnvidia-ml.so.<version>   the library as the driver ships it
#   DIR/<version>/libnvidia-ml.so.1           its SONAME link
#   DIR/<version>/nvidia-smi                  that branch's nvidia-smi
#   DIR/glibc/                                libc6 of Debian 13, extracted (usr/lib/x86_64-linux-gnu/...)
#   DIR/versions                              one "<branch> <version>" line per driver
#
#   hack/nvidia-drivers.sh          fetch what is missing, print DIR
#
# The machine's apt configuration stays untouched: a private apt directory under the cache takes
# the machine's own Debian sources with every component and the suites these packages live in
# (bookworm, bookworm-backports, trixie), and apt-get runs with its lists and archives there.
# No host name is written: the sources file is derived from the machine's own with sed.
set -euo pipefail
cd "$(dirname "$0")/.."

cache_root=${GPUHEALTH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}
out=$cache_root/nvidia-drivers/v1
say() { echo "[nvidia-drivers] $*" >&2; }

# branch, version, library package, nvidia-smi package, Debian version wanted. A Debian point
# release may replace a version: then the suite's own candidate is taken, and said.
drivers=(
	"470 470.256.02 libnvidia-tesla-470-ml1 nvidia-tesla-470-smi 470.256.02-1~deb12u1 bookworm"
	"525 525.147.05 libnvidia-tesla-ml1 nvidia-tesla-smi 525.147.05-15~deb12u1 bookworm"
	"535 535.261.03 libnvidia-ml1 nvidia-smi 535.261.03-1 bookworm"
	"550 550.163.01 libnvidia-ml1 nvidia-smi 550.163.01-2 trixie"
)

if [[ -f $out/.complete ]]; then
	echo "$out"
	exit 0
fi

if [[ $(uname -m) != x86_64 ]]; then
	say "only x86_64 machines fetch the amd64 driver packages"
	exit 1
fi
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || {
	say "needs apt-get and dpkg-deb (a Debian machine)"
	exit 1
}
sources=/etc/apt/sources.list.d/debian.sources
[[ -r $sources ]] || {
	say "no $sources to derive the private apt configuration from"
	exit 1
}

apt_dir=$cache_root/nvidia-drivers/apt
mkdir -p "$apt_dir/sources.d" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
# Every component; the bookworm suites gain bookworm-backports and trixie (security stanzas are
# left as they are).
sed -E '/^Suites:/{/-security/!s/$/ bookworm-backports trixie/}; s/^Components:.*/Components: main contrib non-free non-free-firmware/' \
	"$sources" >"$apt_dir/sources.d/gpuhealth.sources"
apt_opts=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$apt_dir/sources.d"
	-o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
	-o Dir::Etc::preferencesparts=/dev/null -o APT::Sandbox::User=root -qq)
say "updating the private package lists"
apt-get "${apt_opts[@]}" update >&2

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# download PKG VERSION SUITE: the exact version, else the suite's candidate.
download() {
	local pkg=$1 version=$2 suite=$3
	(cd "$tmp" && apt-get "${apt_opts[@]}" download "$pkg=$version" >&2 2>/dev/null) && return
	say "$pkg=$version is gone from the mirror; taking $pkg from $suite"
	(cd "$tmp" && apt-get "${apt_opts[@]}" download "$pkg/$suite" >&2)
}

staging=$out.new
rm -rf "$staging"
mkdir -p "$staging"
for line in "${drivers[@]}"; do
	read -r branch version libpkg smipkg debversion suite <<<"$line"
	say "fetching driver $version ($libpkg, $smipkg)"
	rm -rf "$tmp"/*
	download "$libpkg" "$debversion" "$suite"
	download "$smipkg" "$debversion" "$suite"
	mkdir -p "$tmp/x"
	for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/x"; done
	lib=$(find "$tmp/x" -type f -name 'libnvidia-ml.so.*' | head -1)
	# Debian's /usr/bin/nvidia-smi is a wrapper script; the ELF binary sits under usr/lib/nvidia.
	smi=$(find "$tmp/x" -type f -name nvidia-smi -size +100k | head -1)
	[[ -n $lib && -n $smi ]] || {
		say "$libpkg/$smipkg hold no libnvidia-ml.so.* or nvidia-smi"
		exit 1
	}
	got=${lib##*/libnvidia-ml.so.}
	mkdir -p "$staging/$got"
	cp "$lib" "$staging/$got/"
	ln -s "libnvidia-ml.so.$got" "$staging/$got/libnvidia-ml.so.1"
	cp "$smi" "$staging/$got/nvidia-smi"
	echo "$branch $got" >>"$staging/versions"
done

say "fetching Debian 13's glibc (a host glibc that is not the image's)"
rm -rf "$tmp"/*
(cd "$tmp" && apt-get "${apt_opts[@]}" download libc6/trixie >&2)
mkdir -p "$staging/glibc"
dpkg-deb -x "$tmp"/libc6_*.deb "$staging/glibc"
rm -rf "$staging/glibc/usr/share"

touch "$staging/.complete"
rm -rf "$out"
mv "$staging" "$out"
say "$out: $(tr '\n' ' ' <"$out/versions")"
echo "$out"
