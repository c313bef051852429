#!/usr/bin/env bash
# Writes internal/simdriver/profiles/<version>.txt: the functions NVIDIA's real libnvidia-ml.so.1
# of each driver branch exports (nm -D --defined-only), from the libraries hack/nvidia-drivers.sh
# fetches. These are facts about the real libraries; the simulated driver exports exactly them.
#
#   hack/sim-driver-profiles.sh
set -euo pipefail
cd "$(dirname "$0")/.."
drivers=$(hack/nvidia-drivers.sh)
mkdir -p internal/simdriver/profiles
while read -r branch version; do
	{
		echo "# NVML functions exported by NVIDIA's libnvidia-ml.so.$version (driver branch $branch), read with nm -D --defined-only by hack/sim-driver-profiles.sh"
		nm -D --defined-only "$drivers/$version/libnvidia-ml.so.1" | awk '$2 == "T" {print $3}' | sort
	} >"internal/simdriver/profiles/$version.txt"
done <"$drivers/versions"
