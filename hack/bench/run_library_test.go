package main

import (
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
)

func TestParseBench(t *testing.T) {
	const out = `goos: linux
goarch: amd64
pkg: github.com/gpuhealth/gpuhealth/pkg/health
cpu: AMD EPYC
BenchmarkXIDStorm/xid=13         	17000000	        71.9 ns/op	  13900000 signals/s	       0 B/op	       0 allocs/op
BenchmarkXIDStorm/xid=13         	16000000	        73.0 ns/op	  13700000 signals/s	       0 B/op	       0 allocs/op
BenchmarkStormRetainedMemory
    bench_test.go:118: retained 9011 bytes
BenchmarkStormRetainedMemory/signals=1000-8 	     100	    120000 ns/op	      9011 retained-B
PASS
ok  	github.com/gpuhealth/gpuhealth/pkg/health	12.345s
`
	figs, err := parseBench([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := []figure.Figure{
		{Part: partLibrary, Run: "1", Name: "BenchmarkXIDStorm/xid=13", Unit: "ns/op", Value: 71.9, Samples: 17000000},
		{Part: partLibrary, Run: "1", Name: "BenchmarkXIDStorm/xid=13", Unit: "signals/s", Value: 13900000, Samples: 17000000},
		{Part: partLibrary, Run: "1", Name: "BenchmarkXIDStorm/xid=13", Unit: "B/op", Value: 0, Samples: 17000000},
		{Part: partLibrary, Run: "1", Name: "BenchmarkXIDStorm/xid=13", Unit: "allocs/op", Value: 0, Samples: 17000000},
		{Part: partLibrary, Run: "2", Name: "BenchmarkXIDStorm/xid=13", Unit: "ns/op", Value: 73.0, Samples: 16000000},
		{Part: partLibrary, Run: "2", Name: "BenchmarkXIDStorm/xid=13", Unit: "signals/s", Value: 13700000, Samples: 16000000},
		{Part: partLibrary, Run: "2", Name: "BenchmarkXIDStorm/xid=13", Unit: "B/op", Value: 0, Samples: 16000000},
		{Part: partLibrary, Run: "2", Name: "BenchmarkXIDStorm/xid=13", Unit: "allocs/op", Value: 0, Samples: 16000000},
		{Part: partLibrary, Run: "1", Name: "BenchmarkStormRetainedMemory/signals=1000", Unit: "ns/op", Value: 120000, Samples: 100},
		{Part: partLibrary, Run: "1", Name: "BenchmarkStormRetainedMemory/signals=1000", Unit: "retained-B", Value: 9011, Samples: 100},
	}
	if len(figs) != len(want) {
		t.Fatalf("%d figures, want %d: %+v", len(figs), len(want), figs)
	}
	for i := range want {
		if figs[i].ID() != want[i].ID() || figs[i].Unit != want[i].Unit || figs[i].Value != want[i].Value || figs[i].Samples != want[i].Samples {
			t.Errorf("figure %d: %+v, want %+v", i, figs[i], want[i])
		}
	}
	if err := (results{Figures: figs}).check(); err != nil {
		t.Errorf("the figures of two runs collide: %v", err)
	}
}

func TestParseBenchRejects(t *testing.T) {
	for _, tc := range []struct {
		name, out, wantErr string
	}{
		{"a value that is not a number", "BenchmarkX \t 100 \t 12,5 ns/op\n", `line 1: BenchmarkX: value "12,5" of ns/op`},
		{"a value without a unit", "PASS\nBenchmarkX \t 100 \t 12.5 ns/op \t 7\n", "line 2: \"BenchmarkX \\t 100 \\t 12.5 ns/op \\t 7\": want value-unit pairs"},
		{"iterations only", "BenchmarkX \t 100\n", "line 1: \"BenchmarkX \\t 100\": want value-unit pairs"},
		{"no results", "PASS\nok  \tgithub.com/gpuhealth/gpuhealth/pkg/health\t0.1s\n", "no benchmark results"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			figs, err := parseBench([]byte(tc.out))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseBench = %+v, %v; want an error containing %q", figs, err, tc.wantErr)
			}
		})
	}
}
