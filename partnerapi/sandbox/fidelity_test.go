package sandbox_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/playpipe/playpipe/internal/testenv"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
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

// Issue 15, point 1: a with-user token minted in standby keeps the partner
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

// Issue 15, point 2: an unknown genre row id is 400 "no results for given
// type"; an existing row without items is 200 items: null.
func TestGenreRowUnknownIDIsNotAnEmptyRow(t *testing.T) {
	for _, mode := range []sandbox.Mode{sandbox.ModeLive, sandbox.ModeStandby} {
		sb := testenv.StartSandbox(t, func(o *sandbox.Options) { o.Mode = mode })
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
