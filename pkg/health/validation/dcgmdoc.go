package validation

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// The keys of dcgmi diag's JSON (nvvs/include/NvvsJsonStrings.h, 3.x and 4.x).
const (
	keyDiag4      = "DCGM Diagnostic"     // 4.x; also 4.x's runtime_error document
	keyDiag3      = "DCGM GPU Diagnostic" // 3.x
	keyIterations = "iterations"
)

// maxCandidates bounds how many places findDocuments tries to decode, so that output full of
// braces costs a bounded amount of work.
const maxCandidates = 16

// findDocuments finds the dcgmi diag JSON documents in output: one usually; with --iterations
// a runtime_error document may precede the iterations document. Text before the first document
// (banners, stderr) and after the last is skipped. A document starts at the first '{' or at a
// '{' that opens a line (jsoncpp's toStyledString puts it there); any other JSON object, such as
// a log line, is passed over.
func findDocuments(out []byte) ([]map[string]any, error) {
	if len(bytes.TrimSpace(out)) == 0 {
		return nil, errors.New("the output does not parse as dcgmi diag JSON: the output is empty")
	}
	first := bytes.IndexByte(out, '{')
	if first < 0 {
		return nil, fmt.Errorf("the output does not parse as dcgmi diag JSON: no '{' in: %s", snippet(out))
	}
	var (
		docs     []map[string]any
		firstErr error
		next     = first // decoding resumes here after a document
	)
	for tries, start := 0, first; start >= 0 && tries < maxCandidates; tries++ {
		doc, end, err := decodeObject(out[start:])
		switch {
		case err != nil:
			if firstErr == nil && docs == nil {
				firstErr = fmt.Errorf("%w at: %s", err, snippet(out[start:]))
			}
		case isDiagDocument(doc):
			docs = append(docs, doc)
			next = start + end
		case firstErr == nil && docs == nil:
			firstErr = fmt.Errorf("a JSON object without %q, %q or %q: %s",
				keyDiag4, keyDiag3, keyIterations, snippet(out[start:]))
		}
		start = nextLineBrace(out, max(start+1, next))
	}
	if len(docs) == 0 {
		if firstErr == nil {
			firstErr = errors.New("no document found")
		}
		return nil, fmt.Errorf("the output does not parse as dcgmi diag JSON: %w", firstErr)
	}
	return docs, nil
}

// snippet is the start of b on one line, to show in a message what the reader saw.
func snippet(b []byte) string {
	if len(b) > 1024 {
		b = b[:1024]
	}
	return clip(strings.Join(strings.Fields(strings.ToValidUTF8(string(b), "\uFFFD")), " "), 120)
}

// decodeObject decodes the JSON object at the start of b and returns where it ended.
func decodeObject(b []byte) (map[string]any, int, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, 0, errors.New("truncated JSON")
		}
		return nil, 0, err
	}
	return doc, int(dec.InputOffset()), nil
}

// nextLineBrace is the index of the next '{' at or after from that opens a line (only spaces or
// tabs before it on its line), or -1.
func nextLineBrace(out []byte, from int) int {
	for i := from; i < len(out); i++ {
		j := bytes.IndexByte(out[i:], '{')
		if j < 0 {
			return -1
		}
		i += j
		k := i - 1
		for k >= 0 && (out[k] == ' ' || out[k] == '\t' || out[k] == '\r') {
			k--
		}
		if k < 0 || out[k] == '\n' {
			return i
		}
	}
	return -1
}

func isDiagDocument(doc map[string]any) bool {
	for _, k := range []string{keyDiag4, keyDiag3, keyIterations} {
		if _, ok := doc[k]; ok {
			return true
		}
	}
	return false
}

// diagSection is the object holding test_categories (and runtime_error) in either version.
func diagSection(doc map[string]any) map[string]any {
	if s := asObject(doc[keyDiag4]); s != nil {
		return s
	}
	return asObject(doc[keyDiag3])
}

// docVersion is the DCGM version a document names: 4.x's metadata.version, the runtime_error
// document's version, or 3.x's top-level version; for iterations the first iteration's.
func docVersion(doc map[string]any) string {
	if v, ok := asString(asObject(doc["metadata"])["version"]); ok && v != "" {
		return v
	}
	if v, ok := asString(diagSection(doc)["version"]); ok && v != "" {
		return v
	}
	if v, ok := asString(doc["version"]); ok && v != "" {
		return v
	}
	for _, it := range asArray(doc[keyIterations]) {
		if v := docVersion(asObject(it)); v != "" {
			return v
		}
	}
	return ""
}

// runtimeError is DCGM's reason a run could not start, found in a document or its iterations.
func runtimeError(doc map[string]any) string {
	if s, ok := diagSection(doc)["runtime_error"]; ok {
		if msg, ok := asString(s); ok {
			return msg
		}
		return fmt.Sprint(s)
	}
	for _, it := range asArray(doc[keyIterations]) {
		if msg := runtimeError(asObject(it)); msg != "" {
			return msg
		}
	}
	return ""
}

func asObject(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func asArray(v any) []any {
	a, _ := v.([]any)
	return a
}

func asString(v any) (string, bool) {
	s, ok := v.(string)
	return s, ok
}

// asInt reads an integer written as a JSON number or a string: 3.x writes gpu_id as "2" in
// per-GPU results and as 2 in deployment results.
func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n, true
		}
		f, err := x.Float64()
		if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return 0, false
		}
		return int64(f), true
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		return n, err == nil
	}
	return 0, false
}
