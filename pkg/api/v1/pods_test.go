package v1_test

import (
	"slices"
	"testing"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

func TestReadPodCards(t *testing.T) {
	for _, tc := range []struct {
		name, value   string
		set           bool
		want          []int
		present, isOK bool
	}{
		{name: "absent"},
		{name: "one card", value: "2", set: true, want: []int{2}, present: true, isOK: true},
		{name: "spread over cards", value: "0, 1", set: true, want: []int{0, 1}, present: true, isOK: true},
		{name: "a part that is no index", value: "1,x", set: true, present: true},
		{name: "negative", value: "-1", set: true, present: true},
		{name: "past the limit", value: "1024", set: true, present: true},
		{name: "empty", value: "", set: true, present: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{}
			if tc.set {
				ann[gpuhealthv1.PodGPUIndexKey] = tc.value
			}
			cards, present, ok := gpuhealthv1.ReadPodCards(ann)
			if !slices.Equal(cards, tc.want) || present != tc.present || ok != tc.isOK {
				t.Errorf("ReadPodCards(%q) = %v, %v, %v; want %v, %v, %v", tc.value, cards, present, ok, tc.want, tc.present, tc.isOK)
			}
		})
	}
}
