#!/usr/bin/env bash
# Regenerates the Go code of gpuhealth's .proto files (make generate-proto): today
# pkg/nvsentinel/datamodels, NVSentinel's platform-connector interface, and
# pkg/deviceapi/v1alpha1, NVIDIA's Device API (NVSentinel's GpuService). protoc comes from Debian's
# protobuf-compiler (the well-known types it imports from libprotobuf-dev), its Go plugins from
# hack/tools.sh, pinned. The generated files are committed: building gpuhealth needs none of this.
set -euo pipefail
cd "$(dirname "$0")/.."

hack/ensure-packages.sh protoc=protobuf-compiler /usr/include/google/protobuf/timestamp.proto=libprotobuf-dev
hack/tools.sh install protoc-gen-go protoc-gen-go-grpc
bin=$(hack/tools.sh bindir)

# --proto_path=pkg registers the file as nvsentinel/datamodels/health_event.proto, a path of
# gpuhealth's own beside NVSentinel's (the message names are NVSentinel's, as the wire needs).
for proto in pkg/nvsentinel/datamodels/health_event.proto pkg/deviceapi/v1alpha1/gpu.proto; do
	protoc --proto_path=pkg \
		--plugin=protoc-gen-go="$bin/protoc-gen-go" --go_out=pkg --go_opt=paths=source_relative \
		--plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" --go-grpc_out=pkg --go-grpc_opt=paths=source_relative \
		"$proto"
done
