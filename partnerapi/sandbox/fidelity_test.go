package sandbox_test

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// catalogTypes returns the page types of a catalog answer.
func catalogTypes(t *testing.T, r resp) []string {
	t.Helper()
	wantStatus(t, r, 200)
	var v struct {
		Catalogs []struct {
			Type string `json:"type"`
		} `json:"catalogs"`
	}
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range v.Catalogs {
		out = append(out, c.Type)
	}
	return out
}

// Fidelity: a with-user token minted in standby keeps the partner
// identity, so the restricted catalog keeps hiding the explicit page.
func TestStandbyWithUserTokenKeepsPartnerIdentity(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	if !slices.Contains(catalogTypes(t, a.do("GET", "/partners/catalog", a.session(), nil)), "explicit") {
		t.Fatal("fixture: the catalog has no explicit page")
	}
	liveUser := a.userSession()
	if slices.Contains(catalogTypes(t, a.do("GET", "/partners/catalog/restricted", liveUser, nil)), "explicit") {
		t.Fatal("live with-user token sees the explicit page")
	}

	sb.SetMode(sandbox.ModeStandby)
	// No credential check in standby (wrong or no credentials), but the
	// e-mail still names the partner.
	for _, body := range []map[string]string{
		{"email": sb.Email},
		{"client_id": "wrong", "client_signature": "wrong", "email": sb.Email},
		a.withEmail(sb.Email),
	} {
		r := a.do("POST", "/partners/session/with-user", "", body)
		wantStatus(t, r, 200)
		tok := tokenOf(t, r.body)
		types := catalogTypes(t, a.do("GET", "/partners/catalog/restricted", tok, nil))
		if len(types) == 0 || slices.Contains(types, "explicit") {
			t.Fatalf("standby with-user token (body %v): restricted catalog types %v, want no explicit page", body, types)
		}
		// With EDGE-IPCountry the country restrictions apply too.
		wantEnvelope(t, a.do("GET", "/partners/catalog/restricted", tok, nil, "EDGE-IPCountry", "CN"), 400, "no catalogs available for this partner")
	}
	// An e-mail that names no partner cannot mint an identity-less token.
	wantEnvelope(t, a.do("POST", "/partners/session/with-user", "", map[string]string{"email": "whoever@example.com"}), 400, "partner not found")
	wantEnvelope(t, a.do("POST", "/partners/session/with-user", "", a.creds()), 401, "please provide user information to create session: email, client_id, client_signature")
	// MintToken(withUser) in standby binds the identity as well.
	if types := catalogTypes(t, a.do("GET", "/partners/catalog/restricted", sb.MintToken(0, true), nil)); slices.Contains(types, "explicit") {
		t.Fatalf("minted standby with-user token sees %v", types)
	}
	// The plain standby session token has no identity: the unrestricted catalog.
	if types := catalogTypes(t, a.do("GET", "/partners/catalog/restricted", a.session(), nil)); !slices.Contains(types, "explicit") {
		t.Fatalf("standby plain token: %v, want the unrestricted catalog", types)
	}
}

// Fidelity: an unknown genre row id is 400 "no results for given
// type"; an existing row without items is 200 items: null.
func TestGenreRowUnknownIDIsNotAnEmptyRow(t *testing.T) {
	for _, mode := range []sandbox.Mode{sandbox.ModeLive, sandbox.ModeStandby} {
		sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.Mode = mode })
		a := newAPI(t, sb)
		tok := a.session()
		for _, id := range []string{"987654321", "-5", "0", "100"} {
			r := a.do("GET", "/partners/genres/"+id, tok, nil)
			wantEnvelope(t, r, 400, "no results for given type")
		}
		cat := sb.Catalog()
		empty := cat.Pages[len(cat.Pages)-1]
		if cat.Genres[empty.ID].Items != nil {
			t.Fatal("fixture: the last page's row has items")
		}
		r := a.do("GET", "/partners/genres/"+itoa(int(empty.ID)), tok, nil)
		wantStatus(t, r, 200)
		if string(r.body) != `{"rows":{"items":null}}` {
			t.Fatalf("%v: empty row body %s", mode, r.body)
		}
	}
}

func lenient(o *sandbox.Config) { o.Lenient = true }

// wireRanks decodes a ranked collection: the ids and ranks in wire order.
func wireRanks(t *testing.T, r resp, path []string, idKey, rankKey string) (ids []int64, ranks []int) {
	t.Helper()
	wantStatus(t, r, 200)
	var v any
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatal(err)
	}
	for _, k := range path {
		v = v.(map[string]any)[k]
	}
	for _, it := range v.([]any) {
		m := it.(map[string]any)
		ids = append(ids, int64(m[idKey].(float64)))
		ranks = append(ranks, int(m[rankKey].(float64)))
	}
	return ids, ranks
}

func contiguous(ids []int64) bool {
	s := slices.Sorted(slices.Values(ids))
	for i := 1; i < len(s); i++ {
		if s[i] != s[i-1]+1 {
			return false
		}
	}
	return true
}

// byRank returns the ids in display order.
func byRank(ids []int64, ranks []int) []int64 {
	idx := make([]int, len(ids))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return ranks[a] - ranks[b] })
	out := make([]int64, len(ids))
	for i, j := range idx {
		out[i] = ids[j]
	}
	return out
}

// Fidelity: in strict mode every ranked collection arrives out of
// order, with gapped ranks that do not follow the ids, and page and list ids
// are not contiguous; lenient mode serves them sorted and contiguous. The
// content (mix and track ids, listings) is the same in both modes.
func TestStrictRankedCollectionsAreShuffled(t *testing.T) {
	for _, strict := range []bool{true, false} {
		var sb *testenv.Sandbox
		if strict {
			sb = testenv.StartSandbox(t)
		} else {
			sb = testenv.StartSandbox(t, lenient)
		}
		a := newAPI(t, sb)
		tok, user := a.session(), a.userSession()
		// check: the wire order is (lenient) or is not (strict) the display
		// order, and the display order is not the id order in strict mode.
		check := func(what string, ids []int64, ranks []int) {
			t.Helper()
			if len(ids) < 2 {
				return
			}
			sortedWire := slices.IsSorted(ranks)
			idOrder := slices.IsSorted(byRank(ids, ranks))
			if strict == sortedWire || strict == idOrder {
				t.Fatalf("strict=%v %s: ids %v ranks %v (wire sorted by rank %v, display order = id order %v)", strict, what, ids, ranks, sortedWire, idOrder)
			}
			if !strict && what != "restricted catalog" && (ranks[0] != 1 || ranks[len(ranks)-1] != len(ranks)) {
				t.Fatalf("lenient %s: ranks %v, want 1…%d", what, ranks, len(ranks))
			}
		}
		pageIDs, ranks := wireRanks(t, a.do("GET", "/partners/catalog", tok, nil), []string{"catalogs"}, "page_id", "ranking")
		check("catalog", pageIDs, ranks)
		if contiguous(pageIDs) == strict {
			t.Fatalf("strict=%v: page ids %v", strict, pageIDs)
		}
		rids, rranks := wireRanks(t, a.do("GET", "/partners/catalog/restricted", user, nil), []string{"catalogs"}, "page_id", "ranking")
		check("restricted catalog", rids, rranks)
		var listIDs []int64
		for _, p := range sb.Catalog().Pages {
			id := itoa(int(p.ID))
			if len(p.Lists) > 0 {
				ids, ranks := wireRanks(t, a.do("GET", "/partners/page/"+id, tok, nil), []string{"page", "lists"}, "list_id", "ranking")
				check("page "+id, ids, ranks)
				listIDs = append(listIDs, ids...)
			}
			if sb.Catalog().Genres[p.ID].Items != nil {
				ids, ranks := wireRanks(t, a.do("GET", "/partners/genres/"+id, tok, nil), []string{"rows", "items"}, "id", "ordering")
				check("genre row "+id, ids, ranks)
			}
		}
		if contiguous(listIDs) == strict {
			t.Fatalf("strict=%v: list ids %v", strict, listIDs)
		}
	}
	s, err := sandbox.New(sandbox.Config{Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	l, err := sandbox.New(sandbox.Config{Seed: 4, Lenient: true})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Catalog().Strict || l.Catalog().Strict {
		t.Fatal("Catalog.Strict does not follow Options.Lenient")
	}
	for i, m := range s.Catalog().Mixes {
		lm := l.Catalog().Mixes[i]
		if m.ID != lm.ID || m.Title != lm.Title || m.LengthSec != lm.LengthSec || !slices.Equal(m.Tracks, lm.Tracks) {
			t.Fatalf("mix %d differs between strict and lenient: %+v vs %+v", i, m, lm)
		}
	}
	if s.Catalog().Mixes[0].ID != 30001 || s.Catalog().Pages[0].ID != 101 || s.Catalog().Pages[0].Lists[0].ID != 2001 {
		t.Fatal("the first ids (mix 30001, page 101, list 2001) must not move")
	}
}

// rawDo sends a request with header pairs added (repeats allowed).
func rawDo(t *testing.T, method, url, body string, hdr ...string) resp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("User-Agent", testUA)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

// Fidelity: strict mode refuses POST bodies that are not declared
// application/json, with 415 and the endpoint's error shape.
func TestStrictRefusesNonJSONContentTypes(t *testing.T) {
	for _, mode := range []sandbox.Mode{sandbox.ModeLive, sandbox.ModeStandby} {
		sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.Mode = mode })
		a := newAPI(t, sb)
		tok := a.session()
		session, _ := json.Marshal(a.creds())
		user, _ := json.Marshal(a.withEmail(sb.Email))
		report, _ := json.Marshal(validReport(sb))
		for _, ct := range [][]string{nil, {"Content-Type", "text/plain"}, {"Content-Type", "application/x-www-form-urlencoded"}, {"Content-Type", "application/jsonx"}, {"Content-Type", "application/json", "Content-Type", "application/json"}} {
			r := rawDo(t, "POST", sb.URL+"/partners/session", string(session), ct...)
			wantEnvelope(t, r, 415, "Content-Type must be application/json")
			r = rawDo(t, "POST", sb.URL+"/partners/session/with-user", string(user), ct...)
			wantEnvelope(t, r, 415, "Content-Type must be application/json")
			r = rawDo(t, "POST", sb.URL+"/partners/royalty-tracking", string(report), append([]string{"Authorization", tok}, ct...)...)
			wantStatus(t, r, 415)
			if string(r.body) != `{"error":true,"message":"Content-Type must be application/json"}` {
				t.Fatalf("%v %v: report 415 body %s", mode, ct, r.body)
			}
		}
		for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON; charset=UTF-8"} {
			wantStatus(t, rawDo(t, "POST", sb.URL+"/partners/session", string(session), "Content-Type", ct), 200)
			wantStatus(t, rawDo(t, "POST", sb.URL+"/partners/royalty-tracking", string(report), "Authorization", tok, "Content-Type", ct), 200)
		}
		// Authentication comes first: no token is 401 whatever the body.
		wantUnauthorized(t, rawDo(t, "POST", sb.URL+"/partners/royalty-tracking", string(report), "Content-Type", "text/plain"))
		if n := sb.Counts().Accepted + sb.Counts().Standby; n != 3 {
			t.Fatalf("%v: %d reports recorded, want the 3 declared JSON", mode, n)
		}
	}
	sb := testenv.StartSandbox(t, lenient)
	a := newAPI(t, sb)
	report, _ := json.Marshal(validReport(sb))
	wantStatus(t, rawDo(t, "POST", sb.URL+"/partners/royalty-tracking", string(report), "Authorization", a.session(), "Content-Type", "text/plain"), 200)
}

// Fidelity: non-canonical path ids and repeated Authorization
// headers are refused in strict mode, with the spec's errors.
func TestStrictRefusesNonCanonicalIDsAndRepeatedAuth(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	for _, c := range []struct{ path, reason string }{
		{"/partners/mix/030001", "Please provide a mix ID as a URL parameter"},
		{"/partners/mix/-0", "Please provide a mix ID as a URL parameter"},
		{"/partners/mix/+30001", "Please provide a mix ID as a URL parameter"},
		{"/partners/page/0101", "no results for given type"},
		{"/partners/list/02001", "no results for given type"},
		{"/partners/genres/0101", "please provide a music row id as a URL parameter"},
	} {
		wantEnvelope(t, a.do("GET", c.path, tok, nil), 400, c.reason)
	}
	wantStatus(t, a.do("GET", "/partners/mix/30001", tok, nil), 200)
	wantEnvelope(t, a.do("GET", "/partners/mix/0", tok, nil), 404, "Mix not found")

	wantUnauthorized(t, rawDo(t, "GET", sb.URL+"/partners/mix/30001", "", "Authorization", tok, "Authorization", tok))
	wantUnauthorized(t, rawDo(t, "GET", sb.URL+"/partners/catalog", "", "Authorization", tok, "Authorization", "x"))
	report, _ := json.Marshal(validReport(sb))
	wantUnauthorized(t, rawDo(t, "POST", sb.URL+"/partners/royalty-tracking", string(report), "Authorization", tok, "Authorization", tok, "Content-Type", "application/json"))
	if sb.Counts().Accepted != 0 {
		t.Fatal("a report with two Authorization headers was recorded")
	}

	l := testenv.StartSandbox(t, lenient)
	la := newAPI(t, l)
	ltok := la.session()
	wantStatus(t, la.do("GET", "/partners/mix/030001", ltok, nil), 200)
	wantStatus(t, rawDo(t, "GET", l.URL+"/partners/mix/30001", "", "Authorization", ltok, "Authorization", ltok), 200)
}
