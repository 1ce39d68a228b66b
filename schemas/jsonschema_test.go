package schemas

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// The JSON Schema documents (draft 2020-12) of the records, one per record
// kind and version: the files *.schema.json of this directory. They describe
// the wire format; ParseEvent is the authoritative validator of events (its
// default policy is what the player event document states) and the tests of
// this file check, with a maintained validator
// (github.com/santhosh-tekuri/jsonschema), that both agree and that the Go
// types match the documents.
const (
	PlayerEventSchemaFile = "player_event.v1.schema.json"
	TrackPlaySchemaFile   = "track_play.v1.schema.json"
	RejectionSchemaFile   = "rejection.v1.schema.json"
	DeliverySchemaFile    = "delivery.v1.schema.json"
)

//go:embed *.schema.json
var jsonSchemas embed.FS

// newSchemaCompiler returns a compiler that reads the embedded documents and
// asserts the playpipe keywords.
func newSchemaCompiler(t testing.TB) *jsonschema.Compiler {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.UseLoader(schemaLoader{})
	c.RegisterVocabulary(playpipeVocab(t))
	c.AssertVocabs()
	return c
}

// compileSchema compiles the embedded document file (a *SchemaFile constant).
func compileSchema(t testing.TB, file string) *jsonschema.Schema {
	t.Helper()
	sch, err := newSchemaCompiler(t).Compile(schemaBaseURL + file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if sch.DraftVersion != 2020 {
		t.Fatalf("%s: draft %d, want 2020-12", file, sch.DraftVersion)
	}
	return sch
}

// loadSchema returns the embedded document file as decoded JSON.
func loadSchema(t testing.TB, file string) map[string]any {
	t.Helper()
	doc, err := schemaLoader{}.Load(schemaBaseURL + file)
	if err != nil {
		t.Fatal(err)
	}
	return doc.(map[string]any)
}

// schemaErr is one broken rule: where in the instance (a JSON pointer, ""
// for the root) and which keyword.
type schemaErr struct {
	path    string
	keyword string
}

// validateSchema returns every violation of sch by the JSON value v (decoded
// with jsonschema.UnmarshalJSON), sorted. A missing required property and an
// unexpected additional one are reported at the property, like the others.
func validateSchema(t testing.TB, sch *jsonschema.Schema, v any) []schemaErr {
	t.Helper()
	err := sch.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("validate: %v", err)
	}
	var out []schemaErr
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		for _, c := range e.Causes {
			walk(c)
		}
		if len(e.Causes) > 0 {
			return
		}
		path := ""
		for _, p := range e.InstanceLocation {
			path += "/" + p
		}
		kw := strings.Join(e.ErrorKind.KeywordPath(), "/")
		switch k := e.ErrorKind.(type) {
		case *kind.Required:
			for _, m := range k.Missing {
				out = append(out, schemaErr{path + "/" + m, kw})
			}
		case *kind.AdditionalProperties:
			for _, p := range k.Properties {
				out = append(out, schemaErr{path + "/" + p, kw})
			}
		default:
			out = append(out, schemaErr{path, kw})
		}
	}
	walk(ve)
	sort.Slice(out, func(i, j int) bool {
		if out[i].path != out[j].path {
			return out[i].path < out[j].path
		}
		return out[i].keyword < out[j].keyword
	})
	return out
}

// decodeStrict decodes one JSON value from raw as the validator wants it
// (numbers as json.Number); ok is false when raw is not exactly one valid
// UTF-8 JSON value.
func decodeStrict(raw []byte) (v any, ok bool) {
	if !utf8.Valid(raw) {
		return nil, false
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	return v, err == nil
}

// nullAsAbsent drops the null members of the event object v that the
// document does not require: ParseEvent reads a present null as an absent
// field, so an optional null is fine, and a required one stays to fail its
// type at the field.
func nullAsAbsent(v any, schema map[string]any) any {
	obj, ok := v.(map[string]any)
	if !ok {
		return v
	}
	required := map[string]bool{}
	for _, r := range schema["required"].([]any) {
		required[r.(string)] = true
	}
	out := make(map[string]any, len(obj))
	for k, x := range obj {
		if x != nil || required[k] {
			out[k] = x
		}
	}
	return out
}

// TestEventSchemaAgreesWithParseEvent checks, on every golden example, that
// the player event JSON Schema and ParseEvent (default policy) agree on
// whether the event is valid and on which fields break a rule.
func TestEventSchemaAgreesWithParseEvent(t *testing.T) {
	sch := compileSchema(t, PlayerEventSchemaFile)
	doc := loadSchema(t, PlayerEventSchemaFile)
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
			errs := eventSchemaErrs(t, sch, doc, c.raw)
			for _, e := range errs {
				schemaFields[strings.SplitN(strings.TrimPrefix(e.path, "/"), "/", 2)[0]] = true
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
			if want, ok := wantEventSchemaErrs[c.name]; ok || !c.valid {
				if got := fmtSchemaErrs(errs); got != want {
					t.Errorf("JSON Schema violations %q, want %q", got, want)
				}
			}
		})
	}
}

// eventSchemaErrs validates the event bytes raw against the player event
// document; a raw that is not one JSON value breaks the document at the root.
func eventSchemaErrs(t testing.TB, sch *jsonschema.Schema, doc map[string]any, raw []byte) []schemaErr {
	t.Helper()
	v, ok := decodeStrict(raw)
	if !ok {
		return []schemaErr{{"", "malformed"}} // not JSON: no schema applies
	}
	return validateSchema(t, sch, nullAsAbsent(v, doc))
}

func fmtSchemaErrs(errs []schemaErr) string {
	s := make([]string, len(errs))
	for i, e := range errs {
		s[i] = e.path + " " + e.keyword
	}
	return strings.Join(s, ", ")
}

// wantEventSchemaErrs is, for every invalid golden example, each instance
// location and keyword of the player event document it breaks ("malformed":
// not one UTF-8 JSON value; "": only rules no keyword expresses, duplicate or
// case-variant keys). These are the rules the hand-written evaluator these
// tests used before reported, but that an integer literal with an exponent or
// beyond 64 bits breaks x-int64 where that evaluator said "type".
var wantEventSchemaErrs = map[string]string{
	"invalid/array_not_object":          " type",
	"invalid/bad_country_digit":         "/country pattern",
	"invalid/bad_country_empty":         "/country pattern",
	"invalid/bad_country_non_ascii":     "/country pattern",
	"invalid/bad_country_three_letters": "/country pattern",
	"invalid/case_folded_keys":          "/country required, /event_id required",
	"invalid/case_variant_beside_field": "",
	"invalid/duplicate_event_id":        "",
	"invalid/duplicate_key_wrong_type":  "/mix_id type",
	"invalid/duplicate_unknown_key":     "",
	"invalid/empty":                     " malformed",
	"invalid/empty_event_id":            "/event_id minLength",
	"invalid/empty_object":              "/country required, /device required, /duration_ms required, /event_id required, /mix_id required, /offset_ms required, /os required, /started_at required, /user_id required, /vendor required",
	"invalid/empty_os_and_device":       "/device minLength, /os minLength",
	"invalid/empty_user_id":             "/user_id minLength",
	"invalid/event_id_129_bytes":        "/event_id x-maxBytes",
	"invalid/invalid_utf8":              " malformed",
	"invalid/many_violations":           "/country pattern, /duration_ms exclusiveMinimum, /mix_id type, /offset_ms minimum, /os minLength, /started_at exclusiveMinimum, /user_id required, /vendor type",
	"invalid/missing_event_id":          "/event_id required",
	"invalid/missing_user_id":           "/user_id required",
	"invalid/missing_vendor":            "/vendor required",
	"invalid/mix_id_overflow":           "/mix_id x-int64",
	"invalid/negative_duration":         "/duration_ms exclusiveMinimum",
	"invalid/negative_offset":           "/offset_ms minimum",
	"invalid/not_json":                  " malformed",
	"invalid/null":                      " type",
	"invalid/null_country":              "/country type",
	"invalid/number":                    " type",
	"invalid/started_at_exponent":       "/started_at x-int64",
	"invalid/started_at_zero":           "/started_at exclusiveMinimum",
	"invalid/truncated":                 " malformed",
	"invalid/two_objects":               " malformed",
	"invalid/unicode_folded_key":        "",
	"invalid/wrong_types":               "/cached type, /end_reason type, /mix_id type, /started_at type",
	"invalid/zero_duration":             "/duration_ms exclusiveMinimum",
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
			compileSchema(t, c.file) // a valid draft 2020-12 document
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

// TestSchemaIntegersAreInt64 checks that every "type": "integer" of the
// documents carries "x-int64": true, so that no integer property lets
// through what ParseEvent and the Go decoders refuse.
func TestSchemaIntegersAreInt64(t *testing.T) {
	for _, file := range []string{PlayerEventSchemaFile, TrackPlaySchemaFile, RejectionSchemaFile, DeliverySchemaFile} {
		var walk func(path string, v any)
		walk = func(path string, v any) {
			switch x := v.(type) {
			case map[string]any:
				if x["type"] == "integer" && x["x-int64"] != true {
					t.Errorf("%s: %s is an integer without \"x-int64\": true", file, path)
				}
				for k, c := range x {
					walk(path+"/"+k, c)
				}
			case []any:
				for i, c := range x {
					walk(path+"/"+strconv.Itoa(i), c)
				}
			}
		}
		walk("#", loadSchema(t, file))
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
			if errs := validateSchema(t, compileSchema(t, r.file), v); len(errs) > 0 {
				t.Errorf("%s does not match %s: %v", b, r.file, errs)
			}
		})
	}
	// And the validator can fail: a record with a wrong version, a bad
	// report id, an unknown outcome, attempt 0 and an unknown field.
	v, _ := decodeStrict([]byte(`{"v":2,"report_id":"x","event_id":"e","outcome":"lost","attempt":0,"http_status":200,"latency_us":1,"at":1,"extra":1}`))
	const want = "/attempt minimum, /extra additionalProperties, /outcome enum, /report_id pattern, /v const"
	if got := fmtSchemaErrs(validateSchema(t, compileSchema(t, DeliverySchemaFile), v)); got != want {
		t.Errorf("violations %q, want %q", got, want)
	}
}
