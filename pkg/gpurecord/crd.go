package gpurecord

import _ "embed"

// CRD is the GPURecord CustomResourceDefinition, as YAML: what the chart installs
// (deployments/helm/gpuhealth/crds/gpurecords.yaml is this file; a test keeps them equal).
//
//go:embed crd.yaml
var CRD []byte
