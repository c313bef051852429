package gpurecord

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// MaxSerialLength bounds a serial the controller takes (NVML's buffer is 30 characters).
const MaxSerialLength = 64

// ValidateSerial reports a serial no GPU has: empty, longer than MaxSerialLength, or with a
// character other than ASCII letters, digits, '.', '_' and '-'. The controller checks every
// serial an agent reports with it before naming a record after it.
func ValidateSerial(serial string) error {
	if serial == "" {
		return fmt.Errorf("empty serial")
	}
	if len(serial) > MaxSerialLength {
		return fmt.Errorf("serial of %d characters (at most %d)", len(serial), MaxSerialLength)
	}
	for i := 0; i < len(serial); i++ {
		if c := serial[i]; !isSerialChar(c) {
			return fmt.Errorf("serial %.64q has %q: only letters, digits, '.', '_' and '-'", serial, c)
		}
	}
	return nil
}

func isSerialChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// NameFor names the record of a valid serial. A serial that is already an object name (NVIDIA's
// are digits) is its own name. Any other (upper case, '_', a leading '-', "..") is lowered, every
// character but a letter or a digit made '-', and 8 hex digits of its SHA-256 appended, so that
// two serials that differ only there keep two records.
func NameFor(serial string) string {
	if len(validation.IsDNS1123Subdomain(serial)) == 0 {
		return serial
	}
	name := strings.Trim(strings.Map(func(r rune) rune {
		switch {
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			return r
		}
		return '-'
	}, serial), "-")
	sum := sha256.Sum256([]byte(serial))
	if name == "" {
		return "gpu-" + hex.EncodeToString(sum[:4])
	}
	return name + "-" + hex.EncodeToString(sum[:4])
}
