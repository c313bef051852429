package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// dcgmi prints its JSON with jsoncpp (1.9.5 in DCGM 4.x) through Json::Value::toStyledString:
// tab indents, " : " between a key and its value, an object's keys sorted byte-wise (jsoncpp
// keeps them in a std::map), every array on lines of its own, and an object or array that is a
// member's value starting on the next line. The documents here are written the same way, so that
// a reader meets the bytes a real dcgmi prints, not only the same JSON.

// jobj is a JSON object; jarr a JSON array. Values are jobj, jarr, string and int.
type (
	jobj map[string]any
	jarr []any
)

// styled writes v as jsoncpp's BuiltStyledStreamWriter does with the default settings (what
// toStyledString uses), plus the newline toStyledString adds.
func styled(v any) []byte {
	w := &styledWriter{indented: true}
	w.value(v)
	w.b.WriteByte('\n')
	return []byte(w.b.String())
}

type styledWriter struct {
	b      strings.Builder
	indent string
	// indented mirrors jsoncpp's indented_: the line is already started where the next token
	// goes, so writeWithIndent must not break it.
	indented bool
}

func (w *styledWriter) value(v any) {
	switch v := v.(type) {
	case string:
		w.b.WriteString(jsoncppQuote(v))
	case int:
		w.b.WriteString(strconv.Itoa(v))
	case jobj:
		if len(v) == 0 {
			w.b.WriteString("{}")
			return
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys) // Go compares strings byte-wise, as std::map<CZString> does
		w.withIndent("{")
		w.indent += "\t"
		for i, k := range keys {
			w.withIndent(jsoncppQuote(k))
			w.b.WriteString(" : ")
			w.value(v[k])
			if i < len(keys)-1 {
				w.b.WriteByte(',')
			}
		}
		w.indent = w.indent[:len(w.indent)-1]
		w.withIndent("}")
	case jarr:
		if len(v) == 0 {
			w.b.WriteString("[]")
			return
		}
		w.withIndent("[")
		w.indent += "\t"
		for i, c := range v {
			if !w.indented {
				w.newline()
			}
			w.indented = true
			w.value(c)
			w.indented = false
			if i < len(v)-1 {
				w.b.WriteByte(',')
			}
		}
		w.indent = w.indent[:len(w.indent)-1]
		w.withIndent("]")
	default:
		w.b.WriteString("null") // no caller builds another type; jsoncpp's word for nothing
	}
}

func (w *styledWriter) newline() {
	w.b.WriteByte('\n')
	w.b.WriteString(w.indent)
}

func (w *styledWriter) withIndent(s string) {
	if !w.indented {
		w.newline()
	}
	w.b.WriteString(s)
	w.indented = false
}

// jsoncppQuote quotes s as valueToQuotedStringN does without emitUTF8: the short escapes, other
// control characters and everything beyond ASCII as \u escapes (lower-case hex, surrogate pairs
// above the BMP); '/' stays as it is.
func jsoncppQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(&b, `\u%04x`, r)
			case r < utf8.RuneSelf:
				b.WriteRune(r)
			case r < 0x10000:
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				r -= 0x10000
				fmt.Fprintf(&b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
