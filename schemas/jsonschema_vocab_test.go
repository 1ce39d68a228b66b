package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/message"
)

// schemaBaseURL is where the documents' $id point; schemaLoader serves them
// from jsonSchemas, so compiling never touches the network or the disk.
const schemaBaseURL = "https://playpipe.dev/schemas/"

// The documents add two keywords to draft 2020-12 (unknown keywords are
// allowed by the draft, so they stay standard documents):
//
//   - x-maxBytes: a string is at most this many bytes of UTF-8 (maxLength
//     counts characters);
//   - x-int64: true on every "type": "integer" property: a number is an
//     integer as ParseEvent reads one, a literal without fraction or exponent
//     that fits in 64 bits (draft 2020-12 alone calls 1.0 and 1e30 integers).
//
// playpipeVocab makes the validator assert them.
const playpipeVocabURL = "https://playpipe.dev/schemas/vocab/playpipe"

// playpipeVocabMeta checks the use of the two keywords in the documents; any
// other x- keyword (a typo) fails the compilation.
const playpipeVocabMeta = `{
	"properties": {
		"x-maxBytes": {"type": "integer", "minimum": 0},
		"x-int64": {"const": true}
	},
	"propertyNames": {"if": {"pattern": "^x-"}, "then": {"enum": ["x-maxBytes", "x-int64"]}}
}`

// schemaLoader loads the embedded documents by their $id.
type schemaLoader struct{}

func (schemaLoader) Load(url string) (any, error) {
	file, ok := strings.CutPrefix(url, schemaBaseURL)
	if !ok {
		return nil, fmt.Errorf("schemas: %s is not an embedded document", url)
	}
	b, err := jsonSchemas.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("schemas: no JSON Schema %q (accepted: %s, %s, %s, %s): %w",
			file, PlayerEventSchemaFile, TrackPlaySchemaFile, RejectionSchemaFile, DeliverySchemaFile, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("schemas: %s: %w", file, err)
	}
	return doc, nil
}

func playpipeVocab(t testing.TB) *jsonschema.Vocabulary {
	t.Helper()
	meta, err := jsonschema.UnmarshalJSON(strings.NewReader(playpipeVocabMeta))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(playpipeVocabURL, meta); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(playpipeVocabURL)
	if err != nil {
		t.Fatal(err)
	}
	return &jsonschema.Vocabulary{URL: playpipeVocabURL, Schema: sch, Compile: compilePlaypipeKeywords}
}

// playpipeKeywords is the compiled form of x-maxBytes and x-int64 in one
// schema object.
type playpipeKeywords struct {
	maxBytes int // -1: no x-maxBytes
	int64    bool
}

func compilePlaypipeKeywords(_ *jsonschema.CompilerContext, obj map[string]any) (jsonschema.SchemaExt, error) {
	k := &playpipeKeywords{maxBytes: -1}
	if v, ok := obj["x-maxBytes"]; ok {
		n, err := strconv.Atoi(fmt.Sprint(v)) // a json.Number, checked by playpipeVocabMeta
		if err != nil {
			return nil, fmt.Errorf("x-maxBytes %v: %w", v, err)
		}
		k.maxBytes = n
	}
	k.int64 = obj["x-int64"] == true
	if k.maxBytes < 0 && !k.int64 {
		return nil, nil
	}
	return k, nil
}

// Validate implements jsonschema.SchemaExt.
func (k *playpipeKeywords) Validate(ctx *jsonschema.ValidatorContext, v any) {
	switch x := v.(type) {
	case string:
		if k.maxBytes >= 0 && len(x) > k.maxBytes {
			ctx.AddError(&maxBytesError{got: len(x), want: k.maxBytes})
		}
	case json.Number:
		if k.int64 && !isInt64Literal(x) {
			ctx.AddError(&int64Error{got: x})
		}
	}
}

// isInt64Literal reports whether n is an integer as ParseEvent reads one.
func isInt64Literal(n json.Number) bool {
	if strings.ContainsAny(string(n), ".eE") {
		return false
	}
	_, err := strconv.ParseInt(string(n), 10, 64)
	return err == nil
}

// maxBytesError is the jsonschema.ErrorKind of x-maxBytes.
type maxBytesError struct{ got, want int }

func (*maxBytesError) KeywordPath() []string { return []string{"x-maxBytes"} }
func (e *maxBytesError) LocalizedString(p *message.Printer) string {
	return p.Sprintf("x-maxBytes: got %d bytes, want at most %d", e.got, e.want)
}

// int64Error is the jsonschema.ErrorKind of x-int64.
type int64Error struct{ got json.Number }

func (*int64Error) KeywordPath() []string { return []string{"x-int64"} }
func (e *int64Error) LocalizedString(p *message.Printer) string {
	return p.Sprintf("x-int64: %s is not a 64-bit integer literal", string(e.got))
}

// TestPlaypipeKeywords checks that the validator asserts x-maxBytes and
// x-int64, and refuses a document that misuses them.
func TestPlaypipeKeywords(t *testing.T) {
	c := newSchemaCompiler(t)
	for url, doc := range map[string]string{
		"mem:ok":       `{"$schema": "https://json-schema.org/draft/2020-12/schema", "properties": {"s": {"type": "string", "x-maxBytes": 3}, "n": {"type": "integer", "x-int64": true}}}`,
		"mem:bytes":    `{"$schema": "https://json-schema.org/draft/2020-12/schema", "properties": {"s": {"x-maxBytes": "3"}}}`,
		"mem:int64":    `{"$schema": "https://json-schema.org/draft/2020-12/schema", "properties": {"n": {"x-int64": false}}}`,
		"mem:unknownx": `{"$schema": "https://json-schema.org/draft/2020-12/schema", "properties": {"s": {"x-maxbytes": 3}}}`,
	} {
		v, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.AddResource(url, v); err != nil {
			t.Fatal(err)
		}
	}
	for url, kw := range map[string]string{"mem:bytes": "/s/x-maxBytes", "mem:int64": "/n/x-int64", "mem:unknownx": "propertyName 'x-maxbytes'"} {
		if _, err := c.Compile(url); err == nil || !strings.Contains(err.Error(), kw) {
			t.Errorf("%s: compile error %v, want one about %s", url, err, kw)
		}
	}
	sch, err := c.Compile("mem:ok")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"s": "abc", "n": 9223372036854775807}`, ""},
		{`{"s": "ab\u00e9", "n": -9223372036854775808}`, "/s x-maxBytes"},
		{`{"n": 9223372036854775808}`, "/n x-int64"},
		{`{"n": 1.0}`, "/n x-int64"},
		{`{"n": 1e3}`, "/n x-int64"},
		{`{"n": 1.5}`, "/n type"},
	} {
		v, ok := decodeStrict([]byte(tc.in))
		if !ok {
			t.Fatalf("bad JSON %s", tc.in)
		}
		if got := fmtSchemaErrs(validateSchema(t, sch, v)); got != tc.want {
			t.Errorf("%s: violations %q, want %q", tc.in, got, tc.want)
		}
	}
}
