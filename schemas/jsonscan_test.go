package schemas

import (
	"strings"
	"testing"
)

// scanAll walks one value the way a record decoder does: an object's known
// keys "s" (string), "n" (int32), "b" (bool) read by type, anything else
// skipped, then End.
func scanAll[S string | []byte](in S) (ok bool) {
	p := newJSONScanner(in)
	if !p.Open('{') {
		return false
	}
	var (
		n    int32
		b    bool
		seen uint32
	)
	for first := true; p.More('}', &first); {
		switch k := p.Key(); string(k) {
		case "s":
			if p.Once(&seen, 1) && !p.Null() {
				p.StrToken()
			}
		case "n":
			if p.Once(&seen, 2) {
				p.Int32(&n)
			}
		case "b":
			if p.Once(&seen, 4) {
				p.Bool(&b)
			}
		default:
			p.Unknown(k, "s", "n", "b")
		}
	}
	return p.End()
}

func TestScannerGood(t *testing.T) {
	for _, in := range []string{
		`{}`,
		` {"s":"x","n":-2147483648,"b":true} `,
		`{"s":null,"n":null,"b":null}`,
		`{"n":2147483647,"other":[1,-0.5e+3,{"a\u00e9\n":[null,true,false]},"é"]}`,
		`{"x":` + strings.Repeat("[", maxJSONDepth-1) + strings.Repeat("]", maxJSONDepth-1) + `}`,
	} {
		if !scanAll(in) || !scanAll([]byte(in)) {
			t.Errorf("%s: gave up, want read", in)
		}
	}
}

// TestGivesUp: every case the scanner is not sure of makes it bad (the
// caller falls back to encoding/json), for both kinds of input.
func TestScannerGivesUp(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"empty", ``},
		{"not an object", `[]`},
		{"trailing bytes", `{} x`},
		{"two values", `{}{}`},
		{"unterminated", `{"s":"x"`},
		{"missing comma", `{"s":"x" "n":1}`},
		{"trailing comma", `{"s":"x",}`},
		{"missing colon", `{"s" "x"}`},
		{"duplicate known key", `{"n":1,"n":2}`},
		{"known key but for case", `{"N":1}`},
		{"key with escape", `{"\u006e":1}`},
		{"non-ASCII key", `{"é":1}`},
		{"string for a number", `{"n":"1"}`},
		{"fraction for an integer", `{"n":1.0}`},
		{"exponent for an integer", `{"n":1e2}`},
		{"int32 overflow", `{"n":2147483648}`},
		{"int32 underflow", `{"n":-2147483649}`},
		{"20 digits", `{"n":10000000000000000000}`},
		{"leading zero", `{"n":01}`},
		{"bare minus", `{"n":-}`},
		{"number for a bool", `{"b":1}`},
		{"bad literal", `{"b":tru}`},
		{"bad null", `{"b":nul}`},
		{"control byte in string", "{\"s\":\"a\x01\"}"},
		{"bad escape", `{"s":"\x"}`},
		{"short unicode escape", `{"s":"\u12"}`},
		{"non-hex unicode escape", `{"s":"\u12g4"}`},
		{"unterminated string", `{"s":"abc`},
		{"bad skipped number", `{"x":1.}`},
		{"bad skipped exponent", `{"x":1e}`},
		{"bad skipped object", `{"x":{"a" 1}}`},
		{"bad skipped array", `{"x":[1 2]}`},
		{"unknown byte", `{"x":@}`},
		{"too deep", `{"x":` + strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth) + `}`},
	} {
		if scanAll(tc.in) {
			t.Errorf("%s: string %q read, want give up", tc.name, tc.in)
		}
		if scanAll([]byte(tc.in)) {
			t.Errorf("%s: []byte %q read, want give up", tc.name, tc.in)
		}
	}
}

// TestBadIsSticky: after the first failure every method is a no-op that
// returns zero values, and Fail makes a good scanner bad.
func TestScannerBadIsSticky(t *testing.T) {
	p := newJSONScanner(`{"n":x} {"s":"y"}`)
	p.Open('{')
	p.Key()
	var n int64 = 7
	p.Int64(&n)
	if !p.Bad() || n != 7 {
		t.Fatalf("Bad() = %v, n = %d after a bad integer; want true, 7", p.Bad(), n)
	}
	pos := p.Pos()
	if k := p.Key(); k != "" {
		t.Errorf("Key() on a bad scanner = %q", k)
	}
	if tok, plain := p.StrToken(); tok != "" || plain {
		t.Errorf("StrToken() on a bad scanner = %q, %v", tok, plain)
	}
	p.Skip()
	if p.Pos() != pos || p.End() {
		t.Errorf("bad scanner moved (%d → %d) or ended", pos, p.Pos())
	}
	q := newJSONScanner([]byte(`{}`))
	q.Fail()
	if !q.Bad() || q.Open('{') || q.End() {
		t.Error("Fail did not make the scanner bad")
	}
}

func TestScannerStrToken(t *testing.T) {
	for _, tc := range []struct {
		in    string
		plain bool
	}{
		{`"abc"`, true},
		{`"é"`, true},
		{`"a\"b"`, false},
		{`"\u00e9"`, false},
		{"\"\xff\"", false}, // invalid UTF-8
	} {
		for _, in := range []any{tc.in, []byte(tc.in)} {
			var tok string
			var plain, bad bool
			switch v := in.(type) {
			case string:
				p := newJSONScanner(v)
				t0, pl := p.StrToken()
				tok, plain, bad = t0, pl, p.Bad()
			case []byte:
				p := newJSONScanner(v)
				t0, pl := p.StrToken()
				tok, plain, bad = string(t0), pl, p.Bad()
			}
			if bad || tok != tc.in || plain != tc.plain {
				t.Errorf("StrToken(%T %q) = %q, plain %v, bad %v; want the whole token, plain %v", in, tc.in, tok, plain, bad, tc.plain)
			}
		}
	}
}

func TestScannerIntegerBounds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		bits uint
		want int64
		ok   bool
	}{
		{`9223372036854775807`, 64, 9223372036854775807, true},
		{`-9223372036854775808`, 64, -9223372036854775808, true},
		{`9223372036854775808`, 64, 0, false},
		{`-9223372036854775809`, 64, 0, false},
		{`127`, 8, 127, true},
		{`-128`, 8, -128, true},
		{`128`, 8, 0, false},
		{`-0`, 64, 0, true},
	} {
		p := newJSONScanner(tc.in)
		v, set := p.Integer(tc.bits)
		if set != tc.ok || v != tc.want || p.Bad() == tc.ok {
			t.Errorf("Integer(%q, %d) = %d, %v (bad %v); want %d, %v", tc.in, tc.bits, v, set, p.Bad(), tc.want, tc.ok)
		}
	}
}

// TestNoAllocs: scanning, including a non-ASCII string longer than any
// stack buffer, allocates nothing for either kind of input.
func TestScannerNoAllocs(t *testing.T) {
	in := `{"s":"` + strings.Repeat("é", 40) + `","n":12,"b":false,"x":[{"y":null},1.5e3,"z"]}`
	bin := []byte(in)
	if n := testing.AllocsPerRun(100, func() {
		if !scanAll(in) || !scanAll(bin) {
			t.Fatal("gave up")
		}
	}); n != 0 {
		t.Errorf("%v allocations per run, want 0", n)
	}
}
