package v1

import (
	"encoding/json"
	"fmt"
	"strings"
)

// parseByUUID decodes the value of annotation key, a JSON object keyed by GPU UUID, whole: an
// empty value is an empty map, and a value that does not decode is an error naming key. Each
// parser of such an annotation checks its entries after this.
func parseByUUID[T any](key, value string) (map[string]T, error) {
	out := map[string]T{}
	if strings.TrimSpace(value) == "" {
		return out, nil
	}
	if err := json.Unmarshal([]byte(value), &out); err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return out, nil
}

// parseRequests is parseByUUID for an annotation of operators' requests (drains, clears,
// validations), which also refuses an entry whose UUID is empty: it names no GPU.
func parseRequests[T any](key, value string) (map[string]T, error) {
	out, err := parseByUUID[T](key, value)
	if err != nil {
		return nil, err
	}
	for uuid := range out {
		if strings.TrimSpace(uuid) == "" {
			return nil, fmt.Errorf("%s: an entry has an empty UUID", key)
		}
	}
	return out, nil
}

// formatByUUID encodes the value of an annotation that is a JSON object keyed by GPU UUID; ""
// when there is no entry (remove the annotation).
func formatByUUID[T any](entries map[string]T) (string, error) {
	if len(entries) == 0 {
		return "", nil
	}
	b, err := json.Marshal(entries)
	return string(b), err
}
