package kube

import (
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"

	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
)

// GPURecordInterface is the client of GPURecords (package gpurecord), gpuhealth's own
// cluster-scoped custom resource.
type GPURecordInterface = Client[*gpurecord.GPURecord, *gpurecord.GPURecordList]

// NewGPURecords returns a GPURecords client over the API server c names. It is not part of
// Interface: only the breaker controller writes records, and an agent reads them once, when it
// starts. Custom resources are served as JSON only, so it asks for JSON.
func NewGPURecords(c *rest.Config) (GPURecordInterface, error) {
	cfg := *c
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	cfg.ContentType = "application/json"
	httpClient, err := rest.HTTPClientFor(&cfg)
	if err != nil {
		return nil, err
	}
	rc, err := groupClient(&cfg, httpClient, "/apis", gpurecord.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return gentype.NewClientWithList[*gpurecord.GPURecord, *gpurecord.GPURecordList](gpurecord.Resource, rc, parameterCodec, "",
		func() *gpurecord.GPURecord { return &gpurecord.GPURecord{} }, func() *gpurecord.GPURecordList { return &gpurecord.GPURecordList{} }), nil
}
