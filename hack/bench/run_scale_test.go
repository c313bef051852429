package main

import (
	"strings"
	"testing"
)

func TestMergeScale(t *testing.T) {
	const doc = "# Benchmarks\n\n| what | median | how |\n|---|---|---|\n| library: a | 1 | x |\n| fleet: b | 2 | y |\n\n## What each figure is\n\ntext\n\n## Knobs\n\nknobs\n"
	rows := []row{{scaleRowPrefix + ": one", "10", "z"}, {scaleRowPrefix + ": two", "20", "z"}}
	section := scaleBegin + "\n## The fleet at scale\n\nfirst\n" + scaleEnd + "\n"
	tests := []struct {
		name     string
		doc      string
		rows     []row
		section  string
		want     []string // in this order
		wantNone []string
	}{
		{
			name:    "into a document without them",
			doc:     doc,
			rows:    rows,
			section: section,
			want: []string{"| fleet: b | 2 | y |\n| " + scaleRowPrefix + ": one | 10 | z |\n| " + scaleRowPrefix + ": two | 20 | z |\n\n## What each figure is",
				"text\n\n" + scaleBegin, scaleEnd + "\n\n## Knobs"},
		},
		{
			name:     "replacing an earlier scale run",
			doc:      mergeScale(doc, []row{{scaleRowPrefix + ": old", "1", "z"}}, strings.Replace(section, "first", "old section", 1)),
			rows:     rows,
			section:  section,
			want:     []string{"| fleet: b | 2 | y |\n| " + scaleRowPrefix + ": one |", "first", "## Knobs"},
			wantNone: []string{"old"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := mergeScale(tc.doc, tc.rows, tc.section)
			at := 0
			for _, w := range tc.want {
				i := strings.Index(got[at:], w)
				if i < 0 {
					t.Fatalf("%q not found after offset %d in:\n%s", w, at, got)
				}
				at += i + len(w)
			}
			for _, w := range tc.wantNone {
				if strings.Contains(got, w) {
					t.Errorf("%q left in:\n%s", w, got)
				}
			}
			if strings.Count(got, scaleBegin) != 1 {
				t.Errorf("%d sections in:\n%s", strings.Count(got, scaleBegin), got)
			}
		})
	}
}

// A `make bench` that did not run the fleet at scale keeps the rows and section it finds.
func TestKeptScaleRoundTrip(t *testing.T) {
	const doc = "| what | median | how |\n|---|---|---|\n| library: a | 1 | x |\n"
	rows := []row{{scaleRowPrefix + ": one", "10", "z"}}
	section := scaleBegin + "\nsection\n" + scaleEnd + "\n"
	merged := mergeScale(doc, rows, section)
	gotRows, gotSection := keptScale(merged)
	if len(gotRows) != 1 || gotRows[0] != rows[0] {
		t.Errorf("rows %v, want %v", gotRows, rows)
	}
	if gotSection != section {
		t.Errorf("section %q, want %q", gotSection, section)
	}
	if again := mergeScale(doc, gotRows, gotSection); again != merged {
		t.Errorf("merging what was kept gives\n%s\nwant\n%s", again, merged)
	}
}
