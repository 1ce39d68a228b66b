package partnerapi

import (
	"reflect"
	"testing"
	"time"
)

func TestDecodeSessionShapes(t *testing.T) {
	for _, tc := range []struct {
		body, want string
		ok         bool
	}{
		{`{"session":{"token":{"token":"a.b.c","error":null}}}`, "a.b.c", true},
		{`{"session":{"token":"a.b.c"}}`, "a.b.c", true},
		{`{"session":{"token":{"token":"","error":"boom"}}}`, "", false},
		{`{"session":{"token":null}}`, "", false},
		{`{"session":null}`, "", false},
		{`{"session":{"token":42}}`, "", false},
		{`{"session":{"token":"has space"}}`, "", false},
		{`{"session":{"token":"Bearer\u0000x"}}`, "", false},
	} {
		got, err := decodeSession([]byte(tc.body))
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("%s: got %q, %v", tc.body, got, err)
		}
	}
}

func TestJWTExpiry(t *testing.T) {
	// {"alg":"HS256"} . {"exp":2000000000,"iat":1}
	exp, ok := jwtExpiry("eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjIwMDAwMDAwMDAsImlhdCI6MX0.sig")
	if !ok || exp.Unix() != 2000000000 {
		t.Fatalf("exp %v %v", exp, ok)
	}
	for _, s := range []string{"tok1", "a.b", "a.!!!.c", "a.e30.c" /* {} */} {
		if _, ok := jwtExpiry(s); ok {
			t.Errorf("%q: exp found", s)
		}
	}
}

func TestDecodeListLiveAndStandby(t *testing.T) {
	live := `{"list":{"id":3,"ranking":1,"title":"L","description":"d","image":{"thumbnail":"t","large":"l","player":"p"},
		"mixes":[{"id":10,"title":"M","description":"md","length":"00:45:00","explicit":1,"bpm":128,"max_bpm":132,"list_id":3}]}}`
	standby := `{"list":{"id":3,"ranking":1,"title":"L","description":"d","image":{"thumbnail":"t","large":"l","player":"p"},
		"mixes":[{"id":10,"title":"M","length":"00:45:00","explicit":true,"min_bpm":124,"max_bpm":132,
		"image_large":"il","image_thumbnail":"it","dj":{"name":"DJ X","image_large":"a","image_thumbnail":"b"}}]}}`
	l, err := decodeList([]byte(live))
	if err != nil {
		t.Fatal(err)
	}
	m := l.Mixes[0]
	if m.ID != 10 || !bool(m.Explicit) || m.BPM != 128 || m.MaxBPM != 132 || m.ListID != 3 || m.DJ != nil || m.RepresentativeBPM() != 128 || l.Image.Player != "p" {
		t.Fatalf("live %+v", l)
	}
	s, err := decodeList([]byte(standby))
	if err != nil {
		t.Fatal(err)
	}
	m = s.Mixes[0]
	if !bool(m.Explicit) || m.BPM != 0 || m.MinBPM != 124 || m.ImageLarge != "il" || m.DJ == nil || m.DJ.Name != "DJ X" || m.RepresentativeBPM() != 128 || m.Description != "" {
		t.Fatalf("standby %+v", m)
	}
	// explicit 0 / false, dj as a bare name
	s, err = decodeList([]byte(`{"list":{"id":1,"mixes":[{"id":1,"explicit":0},{"id":2,"explicit":false,"dj":"Solo"}]}}`))
	if err != nil || bool(s.Mixes[0].Explicit) || bool(s.Mixes[1].Explicit) || s.Mixes[1].DJ.Name != "Solo" {
		t.Fatalf("%+v %v", s, err)
	}
	if _, err := decodeList([]byte(`{"list":null}`)); err == nil {
		t.Fatal("null list accepted")
	}
}

func TestDecodeGenreRowNull(t *testing.T) {
	r, err := decodeGenreRow([]byte(`{"rows":{"items":null}}`))
	if err != nil || r.Items != nil {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = decodeGenreRow([]byte(`{"rows":{"items":[{"id":1,"title":"G","bpm":120,"ordering":2,"spotlight_image":"s"}]}}`))
	if err != nil || len(r.Items) != 1 || r.Items[0].SpotlightImage != "s" || r.Items[0].Ordering != 2 {
		t.Fatalf("%+v %v", r, err)
	}
}

func TestDecodeDegradedMix(t *testing.T) {
	body := `{"mix":{"id":5,"title":"T","description":"","length":"01:00:00","min_bpm":128,"max_bpm":128,"explicit":false,
		"url":"https://cdn/x.mp3","android_hls_url":"https://cdn/x.mp3","ios_hls_url":"https://cdn/x.mp3","hls_url":"https://cdn/x.mp3",
		"dj":{"name":"D"},"tracks":[{"id":1,"time":"00:00:00","isrc":"GB-ABC-12-00001","artist":"a","title":"t"}],
		"genres":[{"id":1,"title":"House","description":""}],"tags":["x"]}}`
	m, err := decodeMix([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if m.MinBPM != m.MaxBPM || m.Description != "" || len(m.Tracks) != 1 || m.Tracks[0].ISRC != "GB-ABC-12-00001" {
		t.Fatalf("%+v", m)
	}
	if m.IOSHLSURL != m.URL || m.AndroidHLSURL != m.URL || m.HLSURL != m.URL {
		t.Fatalf("stream URLs %+v", m)
	}
}

func TestParseFields(t *testing.T) {
	for msg, want := range map[string][]string{
		"include the required fields: playlength,country":                                        {"playlength", "country"},
		"include the required fields: trackid":                                                   {"trackid"},
		"include the required fields: a, b ,,c":                                                  {"a", "b", "c"},
		"Include The Required Fields: x":                                                         {"x"},
		"internal service error":                                                                 nil,
		"wrongly typed optional fields: cachedplay":                                              {"cachedplay"},
		"include the required fields: country; wrongly typed optional fields: userid,cachedplay": {"country", "userid", "cachedplay"},
	} {
		if got := parseFields(msg); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: %q", msg, got)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"3": 3 * time.Second, "0": 0, "-1": 0, "x": 0, "": 0,
		"Wed, 01 Jan 2025 00:00:10 GMT": 10 * time.Second,
		"Tue, 31 Dec 2024 23:00:00 GMT": 0,
	} {
		if got := parseRetryAfter(v, now); got != want {
			t.Errorf("%q: %v, want %v", v, got, want)
		}
	}
}

func TestReportMessage(t *testing.T) {
	c := &Client{}
	for body, want := range map[string]string{
		`{"error":false,"message":"ok"}`:          "ok",
		`{"message" : "success", "error": false}`: "success",
		`{"error":false,"message":"a\"b"}`:        `a"b`,
		`{"error":false}`:                         "",
		`not json`:                                "",
	} {
		if got := c.reportMessage([]byte(body)); got != want {
			t.Errorf("%s: %q", body, got)
		}
	}
}
