package schemas

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// This file checks the embedded JSON Schema documents against the Go side
// with a small evaluator of the keywords the documents use. The evaluator
// fails on any keyword it does not know, so a document cannot silently use a
// rule that these tests ignore. Integers are what ParseEvent accepts: JSON
// numbers without fraction or exponent that fit in 64 bits (stricter than
// draft 2020-12, which calls 1.0 an integer; the documents say so).

type schemaErr struct {
	path    string // JSON pointer-ish: "/mix_id", "" for the root
	keyword string
}

var knownKeywords = map[string]bool{
	"$schema": true, "$id": true, "title": true, "description": true, "default": true,
	"type": true, "required": true, "properties": true, "additionalProperties": true,
	"items": true, "minItems": true, "minLength": true, "maxLength": true, "x-maxBytes": true,
	"pattern": true, "minimum": true, "exclusiveMinimum": true, "maximum": true, "const": true, "enum": true,
}

func loadSchema(t testing.TB, file string) map[string]any {
	t.Helper()
	b, err := JSONSchema(file)
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if s["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
		t.Fatalf("%s: $schema is %v, want draft 2020-12", file, s["$schema"])
	}
	return s
}

// evaluate returns every violation of schema by the JSON value v (decoded with UseNumber).
func evaluate(t testing.TB, schema map[string]any, v any, path string) []schemaErr {
	t.Helper()
	var errs []schemaErr
	fail := func(kw string) { errs = append(errs, schemaErr{path, kw}) }
	for kw := range schema {
		if !knownKeywords[kw] {
			t.Fatalf("schema at %q uses keyword %q that the test evaluator does not know", path, kw)
		}
	}
	if typ, ok := schema["type"].(string); ok && !hasType(v, typ) {
		fail("type")
		return errs // the other keywords do not apply to a value of the wrong type
	}
	if c, ok := schema["const"]; ok && fmt.Sprint(c) != fmt.Sprint(v) {
		fail("const")
	}
	if e, ok := schema["enum"].([]any); ok {
		found := false
		for _, x := range e {
			found = found || fmt.Sprint(x) == fmt.Sprint(v)
		}
		if !found {
			fail("enum")
		}
	}
	switch x := v.(type) {
	case map[string]any:
		if req, ok := schema["required"].([]any); ok {
			for _, r := range req {
				if fv, ok := x[r.(string)]; !ok || fv == nil {
					// A present null is "absent" for ParseEvent; for the
					// schema it is a type error, reported at the field.
					if ok {
						errs = append(errs, schemaErr{path + "/" + r.(string), "type"})
					} else {
						errs = append(errs, schemaErr{path + "/" + r.(string), "required"})
					}
				}
			}
		}
		props, _ := schema["properties"].(map[string]any)
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fv := x[k]
			if ps, ok := props[k].(map[string]any); ok {
				if fv == nil {
					continue // null: absent for optional fields, reported above for required ones
				}
				errs = append(errs, evaluate(t, ps, fv, path+"/"+k)...)
				continue
			}
			switch ap := schema["additionalProperties"].(type) {
			case bool:
				if !ap {
					errs = append(errs, schemaErr{path + "/" + k, "additionalProperties"})
				}
			case map[string]any:
				errs = append(errs, evaluate(t, ap, fv, path+"/"+k)...)
			}
		}
	case []any:
		if n, ok := num(schema["minItems"]); ok && float64(len(x)) < n {
			fail("minItems")
		}
		if is, ok := schema["items"].(map[string]any); ok {
			for i, e := range x {
				errs = append(errs, evaluate(t, is, e, path+"/"+strconv.Itoa(i))...)
			}
		}
	case string:
		if n, ok := num(schema["minLength"]); ok && float64(utf8.RuneCountInString(x)) < n {
			fail("minLength")
		}
		if n, ok := num(schema["maxLength"]); ok && float64(utf8.RuneCountInString(x)) > n {
			fail("maxLength")
		}
		if n, ok := num(schema["x-maxBytes"]); ok && float64(len(x)) > n {
			fail("x-maxBytes")
		}
		if p, ok := schema["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(x) {
			fail("pattern")
		}
	case json.Number:
		f, _ := x.Float64()
		if n, ok := num(schema["minimum"]); ok && f < n {
			fail("minimum")
		}
		if n, ok := num(schema["maximum"]); ok && f > n {
			fail("maximum")
		}
		if n, ok := num(schema["exclusiveMinimum"]); ok && f <= n {
			fail("exclusiveMinimum")
		}
	}
	return errs
}

func num(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

func hasType(v any, typ string) bool {
	switch typ {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok || strings.ContainsAny(string(n), ".eE") {
			return false
		}
		_, err := strconv.ParseInt(string(n), 10, 64)
		return err == nil
	}
	panic("unknown type " + typ)
}

// decodeStrict decodes one JSON value from raw; ok is false when raw is not
// exactly one valid UTF-8 JSON value.
func decodeStrict(raw []byte) (v any, ok bool) {
	if !utf8.Valid(raw) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err == nil {
		return nil, false // trailing data
	}
	return v, true
}

// TestEventSchemaAgreesWithParseEvent checks, on every golden example, that
// the player event JSON Schema and ParseEvent (default policy) agree on
// whether the event is valid and on which fields break a rule.
func TestEventSchemaAgreesWithParseEvent(t *testing.T) {
	schema := loadSchema(t, PlayerEventSchemaFile)
	for _, c := range goldenCases(t) {
		t.Run(c.name, func(t *testing.T) {
			_, vs := ParseEvent(c.raw, ValidateOptions{})
			goFields := map[string]bool{}
			for _, v := range vs {
				if v.Reason == ReasonDuplicateKey || v.Reason == ReasonKeyCase {
					// Unique, case-sensitive keys: stated in the document's
					// description; no JSON Schema keyword expresses them.
					continue
				}
				goFields[v.Field] = true
			}
			schemaFields := map[string]bool{}
			if v, ok := decodeStrict(c.raw); !ok {
				schemaFields[""] = true // not JSON: no schema applies
			} else {
				for _, e := range evaluate(t, schema, v, "") {
					schemaFields[strings.SplitN(strings.TrimPrefix(e.path, "/"), "/", 2)[0]] = true
				}
			}
			for _, v := range vs {
				if v.Reason == ReasonDuplicateKey {
					// Which value of a duplicate key counts is undefined in
					// JSON; ParseEvent validates the first, decoders keep the last.
					delete(schemaFields, v.Field)
					delete(goFields, v.Field)
				}
			}
			if !reflect.DeepEqual(goFields, schemaFields) {
				t.Errorf("fields breaking a rule: ParseEvent %v, JSON Schema %v", keysOf(goFields), keysOf(schemaFields))
			}
		})
	}
}

func keysOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// jsonFields returns the JSON field names of struct type t (json tags).
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		out[name] = f.Type
	}
	return out
}

// TestSchemasMatchGoTypes checks that every property of each document is a
// JSON field of its Go type and the reverse, with the same kind.
func TestSchemasMatchGoTypes(t *testing.T) {
	cases := []struct {
		file string
		typ  reflect.Type
		sub  map[string]reflect.Type // nested object properties to check too
	}{
		{PlayerEventSchemaFile, reflect.TypeOf(PlayerEvent{}), nil},
		{TrackPlaySchemaFile, reflect.TypeOf(TrackPlay{}), map[string]reflect.Type{"report": reflect.TypeOf(PlayReport{})}},
		{RejectionSchemaFile, reflect.TypeOf(Rejection{}), map[string]reflect.Type{"source": reflect.TypeOf(Source{})}},
		{DeliverySchemaFile, reflect.TypeOf(Delivery{}), nil},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			s := loadSchema(t, c.file)
			checkProps(t, c.file, s, c.typ)
			props := s["properties"].(map[string]any)
			for name, typ := range c.sub {
				checkProps(t, c.file+"#"+name, props[name].(map[string]any), typ)
			}
		})
	}
}

func checkProps(t *testing.T, where string, s map[string]any, typ reflect.Type) {
	t.Helper()
	props, _ := s["properties"].(map[string]any)
	fields := jsonFields(typ)
	for name, p := range props {
		ft, ok := fields[name]
		if !ok {
			t.Errorf("%s: property %q is not a JSON field of %s", where, name, typ)
			continue
		}
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		want := map[reflect.Kind]string{reflect.String: "string", reflect.Int64: "integer", reflect.Int: "integer", reflect.Int32: "integer",
			reflect.Bool: "boolean", reflect.Struct: "object", reflect.Slice: "array"}[ft.Kind()]
		got, _ := p.(map[string]any)["type"].(string)
		if _, isConst := p.(map[string]any)["const"]; got == "" && isConst {
			got = "integer"
		}
		if got != want {
			t.Errorf("%s: property %q has type %q, Go field is %s (%q)", where, name, got, ft, want)
		}
	}
	for name := range fields {
		if _, ok := props[name]; !ok {
			t.Errorf("%s: Go field %q of %s is missing from the schema", where, name, typ)
		}
	}
	if req, ok := s["required"].([]any); ok {
		for _, r := range req {
			if _, ok := props[r.(string)]; !ok {
				t.Errorf("%s: required %q is not a property", where, r)
			}
		}
	}
}

// TestRecordsValidateAgainstSchemas marshals fully populated records (every
// optional field set) and minimal ones, and checks them against their documents.
func TestRecordsValidateAgainstSchemas(t *testing.T) {
	f, tr, zero := false, true, int64(0)
	full := PlayerEvent{EventID: "e", MixID: 1, StartedAt: 1, OffsetMS: 0, DurationMS: 1, UserID: "u", Country: "DE", OS: "o", Device: "d",
		Vendor: &zero, SourceStream: "mix", Cached: &f, JumpForward: &tr, EndReason: &zero}
	vs := []Violation{{Field: "country", Reason: ReasonBadCountry, Detail: "x"}}
	records := []struct {
		file string
		v    any
	}{
		{PlayerEventSchemaFile, full},
		{TrackPlaySchemaFile, TrackPlay{V: TrackPlayVersion, ReportID: ReportID("e", 2), EventID: "e", MixID: 1, Position: 2, OverlapMS: 1500,
			BelowMinimum: true, NoUserID: true, StandbyListing: true, DerivedAt: 1700000000000,
			Report: PlayReport{TrackID: 1, PlayedAt: 1700000000000, PlayLength: 1, SourceStream: "mix", SourceDetail: "t", OS: "o",
				Device: "d", Country: "DE", Vendor: 0, UserID: "u", ISRC: "X", EndReason: &zero, CachedPlay: &f, JumpForward: &tr}}},
		{TrackPlaySchemaFile, TrackPlay{V: TrackPlayVersion, ReportID: ReportID("e", 0), EventID: "e", Report: PlayReport{Country: "DE"}}},
		{RejectionSchemaFile, NewRejection([]byte("{\xff"), "e", vs, Source{Topic: "ingest", Partition: -1, Offset: -1}, 1)},
		{RejectionSchemaFile, NewRejection([]byte("{}"), "", vs, Source{Topic: "plays.events", Partition: 2, Offset: 7}, 1)},
		{DeliverySchemaFile, Delivery{V: DeliveryVersion, ReportID: ReportID("e", 0), EventID: "e", Outcome: OutcomeRetry, Attempt: 2, HTTPStatus: 503,
			ServedBy: "standby", Partner: "https://api.partner.example", Message: "m", Fields: []string{"country"}, Reason: "http_503", LatencyUS: 10, TraceID: "abc", Replay: true, At: 1}},
		{DeliverySchemaFile, Delivery{V: DeliveryVersion, ReportID: ReportID("e", 0), EventID: "e", Outcome: OutcomeDelivered, Attempt: 1, HTTPStatus: 200}},
	}
	for i, r := range records {
		t.Run(fmt.Sprintf("%d-%s", i, r.file), func(t *testing.T) {
			b, err := json.Marshal(r.v)
			if err != nil {
				t.Fatal(err)
			}
			v, ok := decodeStrict(b)
			if !ok {
				t.Fatalf("bad JSON %s", b)
			}
			if errs := evaluate(t, loadSchema(t, r.file), v, ""); len(errs) > 0 {
				t.Errorf("%s does not match %s: %v", b, r.file, errs)
			}
		})
	}
	// And the evaluator can fail: a record with a wrong version and an unknown field.
	v, _ := decodeStrict([]byte(`{"v":2,"report_id":"x","event_id":"e","outcome":"lost","attempt":0,"http_status":200,"latency_us":1,"at":1,"extra":1}`))
	errs := evaluate(t, loadSchema(t, DeliverySchemaFile), v, "")
	if len(errs) != 5 {
		t.Errorf("want 5 violations (const, pattern, enum, minimum, additionalProperties), got %v", errs)
	}
}
