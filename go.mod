module github.com/gpuhealth/gpuhealth

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/go-logr/logr v1.4.3
	github.com/spf13/cobra v1.10.2
	go.yaml.in/yaml/v3 v3.0.5
	golang.org/x/sync v0.22.0
	k8s.io/utils v0.0.0-20261023123148-ca04ba58ecab
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
)
