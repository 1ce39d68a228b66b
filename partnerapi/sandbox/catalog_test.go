package sandbox_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

func hmsSec(t testing.TB, s string) int {
	t.Helper()
	var h, m, sec int
	if n, err := fmt.Sscanf(s, "%02d:%02d:%02d", &h, &m, &sec); n != 3 || err != nil || len(s) != 8 {
		t.Fatalf("duration %q is not HH:MM:SS", s)
	}
	return h*3600 + m*60 + sec
}

func TestCatalogWalkMatchesGeneratedCatalog(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	cat := sb.Catalog()

	var catalogs struct {
		Catalogs []struct {
			PageID    int64  `json:"page_id"`
			Title     string `json:"title"`
			Type      string `json:"type"`
			Ranking   int    `json:"ranking"`
			ListCount int    `json:"list_count"`
		} `json:"catalogs"`
	}
	r := a.do("GET", "/partners/catalog", tok, nil)
	wantStatus(t, r, 200)
	if err := json.Unmarshal(r.body, &catalogs); err != nil {
		t.Fatal(err)
	}
	if len(catalogs.Catalogs) != len(cat.Pages) {
		t.Fatalf("%d catalog entries, want %d", len(catalogs.Catalogs), len(cat.Pages))
	}
	advertisedMore, emptyLists, emptyPages := 0, 0, 0
	for i, e := range catalogs.Catalogs {
		// Matched by id: the wire order is shuffled in strict mode
		// (TestStrictRankedCollectionsAreShuffled).
		p, ok := cat.Page(e.PageID)
		if !ok || e.Title != p.Title || e.Type != p.Type || e.Ranking != p.Ranking || e.ListCount != len(p.Lists) {
			t.Fatalf("entry %d = %+v, page %+v", i, e, p)
		}
		pr := a.do("GET", "/partners/page/"+strconv.FormatInt(e.PageID, 10), tok, nil)
		if e.ListCount == 0 {
			wantEnvelope(t, pr, 400, "no results for given type")
			emptyPages++
			continue
		}
		wantStatus(t, pr, 200)
		var page struct {
			Page struct {
				ID    int64  `json:"id"`
				Title string `json:"title"`
				Lists []struct {
					ListID   int64 `json:"list_id"`
					Ranking  int   `json:"ranking"`
					MixCount int   `json:"mix_count"`
					Image    struct {
						Thumbnail, Large, Player string
					} `json:"image"`
				} `json:"lists"`
			} `json:"page"`
		}
		if err := json.Unmarshal(pr.body, &page); err != nil {
			t.Fatal(err)
		}
		if page.Page.ID != p.ID || len(page.Page.Lists) != len(p.Lists) {
			t.Fatalf("page %d: %s", p.ID, pr.body)
		}
		for _, pl := range page.Page.Lists {
			want, ok := cat.List(pl.ListID)
			if !ok || want.PageID != p.ID || pl.Ranking != want.Ranking || pl.Image.Thumbnail == "" || pl.Image.Large == "" || pl.Image.Player == "" {
				t.Fatalf("page list %+v", pl)
			}
			lr := a.do("GET", "/partners/list/"+strconv.FormatInt(pl.ListID, 10), tok, nil)
			if len(want.MixIDs) == 0 {
				wantEnvelope(t, lr, 400, "no results for given type")
				emptyLists++
				continue
			}
			wantStatus(t, lr, 200)
			var list struct {
				List struct {
					ID    int64            `json:"id"`
					Mixes []map[string]any `json:"mixes"`
				} `json:"list"`
			}
			if err := json.Unmarshal(lr.body, &list); err != nil {
				t.Fatal(err)
			}
			if pl.MixCount > len(list.List.Mixes) {
				advertisedMore++
			} else if pl.MixCount < len(list.List.Mixes) {
				t.Fatalf("mix_count %d < %d returned", pl.MixCount, len(list.List.Mixes))
			}
			for _, mx := range list.List.Mixes {
				keys := slices.Sorted(mapKeys(mx))
				if want := []string{"bpm", "description", "explicit", "id", "length", "list_id", "max_bpm", "title"}; !slices.Equal(keys, want) {
					t.Fatalf("live list summary keys %v, want %v", keys, want)
				}
				if e := mx["explicit"].(float64); e != 0 && e != 1 {
					t.Fatalf("explicit %v", e)
				}
				if int64(mx["list_id"].(float64)) != pl.ListID {
					t.Fatalf("list_id %v", mx["list_id"])
				}
			}
		}
	}
	if advertisedMore == 0 || emptyLists != 1 || emptyPages != 1 {
		t.Fatalf("fixtures: %d lists advertise more mixes than returned (want > 0), %d empty lists (want 1), %d empty pages (want 1)", advertisedMore, emptyLists, emptyPages)
	}
}

func mapKeys(m map[string]any) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestMixesTracksAndISRCQuirks(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	cat := sb.Catalog()
	for _, want := range cat.Mixes {
		r := a.do("GET", "/partners/mix/"+strconv.FormatInt(want.ID, 10), tok, nil)
		wantStatus(t, r, 200)
		var m struct {
			Mix struct {
				ID                                   int64
				Length                               string `json:"length"`
				MinBPM                               int    `json:"min_bpm"`
				MaxBPM                               int    `json:"max_bpm"`
				Explicit                             any    `json:"explicit"`
				URL                                  string `json:"url"`
				Android                              string `json:"android_hls_url"`
				IOS                                  string `json:"ios_hls_url"`
				HLS                                  string `json:"hls_url"`
				DJ                                   map[string]string
				Tracks                               []map[string]any `json:"tracks"`
				Genres                               []map[string]any `json:"genres"`
				Tags                                 []string         `json:"tags"`
				Description, ImageLarge, ImageThumbn string
			} `json:"mix"`
		}
		if err := json.Unmarshal(r.body, &m); err != nil {
			t.Fatal(err)
		}
		x := m.Mix
		if n := len(x.Tracks); n < 8 || n > 25 || n != len(want.Tracks) {
			t.Fatalf("mix %d has %d tracks", want.ID, n)
		}
		if _, ok := x.Explicit.(bool); !ok {
			t.Fatalf("mix explicit must be a boolean: %v", x.Explicit)
		}
		if x.HLS != x.Android || x.Android == x.IOS || x.URL == "" || x.MinBPM >= x.MaxBPM || len(x.Genres) == 0 || len(x.Tags) == 0 || x.DJ["name"] == "" {
			t.Fatalf("mix %d: %s", want.ID, r.body)
		}
		prev := -1
		for i, tr := range x.Tracks {
			at := hmsSec(t, tr["time"].(string))
			if at <= prev {
				t.Fatalf("mix %d: track times not increasing at %d", want.ID, i)
			}
			prev = at
			if int64(tr["id"].(float64)) != want.Tracks[i].ID || tr["isrc"].(string) != want.Tracks[i].ISRC || at != want.Tracks[i].StartSec {
				t.Fatalf("mix %d track %d = %v, catalog %+v", want.ID, i, tr, want.Tracks[i])
			}
		}
		if total := hmsSec(t, x.Length); total <= prev || total != want.LengthSec {
			t.Fatalf("mix %d length %s", want.ID, x.Length)
		}
	}
	// ISRC quirks a careless client would mangle, served byte for byte.
	for _, q := range []sandbox.ISRCQuirk{sandbox.QuirkLowercase, sandbox.QuirkHyphenated, sandbox.QuirkTrailingSpace, sandbox.QuirkShared, sandbox.QuirkEmpty} {
		tracks := cat.TracksWithQuirk(q)
		if len(tracks) == 0 {
			t.Fatalf("no track with ISRC quirk %s", q)
		}
		mix, pos, ok := cat.MixContaining(tracks[0].ID)
		if !ok {
			t.Fatalf("quirk %s track %d is in no mix", q, tracks[0].ID)
		}
		r := a.do("GET", "/partners/mix/"+strconv.FormatInt(mix.ID, 10), tok, nil)
		wantISRC, _ := json.Marshal(tracks[0].ISRC)
		if !bytes.Contains(r.body, append([]byte(`"isrc":`), wantISRC...)) || mix.Tracks[pos].ISRC != tracks[0].ISRC {
			t.Fatalf("quirk %s: ISRC %q not served byte for byte", q, tracks[0].ISRC)
		}
		switch q {
		case sandbox.QuirkLowercase:
			if tracks[0].ISRC != strings.ToLower(tracks[0].ISRC) {
				t.Fatalf("lowercase ISRC %q", tracks[0].ISRC)
			}
		case sandbox.QuirkHyphenated:
			if strings.Count(tracks[0].ISRC, "-") != 3 {
				t.Fatalf("hyphenated ISRC %q", tracks[0].ISRC)
			}
		case sandbox.QuirkTrailingSpace:
			if !strings.HasSuffix(tracks[0].ISRC, " ") {
				t.Fatalf("trailing space ISRC %q", tracks[0].ISRC)
			}
		case sandbox.QuirkShared:
			if len(tracks) != 2 || tracks[0].ISRC != tracks[1].ISRC || tracks[0].ID == tracks[1].ID {
				t.Fatalf("shared ISRC tracks %+v", tracks)
			}
		}
	}
}

func TestCatalogDeterministicBySeed(t *testing.T) {
	body := func(seed int64) string {
		sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.Seed = seed })
		a := newAPI(t, sb)
		tok := a.session()
		return string(a.do("GET", "/partners/catalog", tok, nil).body) + string(a.do("GET", "/partners/mix/30007", tok, nil).body)
	}
	first, second, other := body(7), body(7), body(8)
	if first != second {
		t.Fatal("same seed, different catalog")
	}
	if first == other {
		t.Fatal("different seeds, same catalog")
	}
}

func TestIDErrors(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	for _, c := range []struct {
		path   string
		status int
		reason string
	}{
		{"/partners/page/", 400, "no results for given type"},
		{"/partners/page", 400, "no results for given type"},
		{"/partners/page/abc", 400, "no results for given type"},
		{"/partners/page/999999", 400, "no results for given type"},
		{"/partners/list/", 400, "no results for given type"},
		{"/partners/list/1.5", 400, "no results for given type"},
		{"/partners/list/999999", 400, "no results for given type"},
		{"/partners/genres/", 400, "please provide a music row id as a URL parameter"},
		{"/partners/genres", 400, "please provide a music row id as a URL parameter"},
		{"/partners/genres/x", 400, "please provide a music row id as a URL parameter"},
		{"/partners/mix/", 400, "Please provide a mix ID as a URL parameter"},
		{"/partners/mix", 400, "Please provide a mix ID as a URL parameter"},
		{"/partners/mix/abc", 400, "Please provide a mix ID as a URL parameter"},
		{"/partners/mix/999999", 404, "Mix not found"},
		{"/partners/mix/-1", 404, "Mix not found"},
	} {
		wantEnvelope(t, a.do("GET", c.path, tok, nil), c.status, c.reason)
	}
}

func TestGenreRows(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	cat := sb.Catalog()
	nulls := 0
	for _, p := range cat.Pages {
		r := a.do("GET", "/partners/genres/"+strconv.FormatInt(p.ID, 10), tok, nil)
		wantStatus(t, r, 200)
		var v struct {
			Rows struct {
				Items *[]map[string]any `json:"items"`
			} `json:"rows"`
		}
		if err := json.Unmarshal(r.body, &v); err != nil {
			t.Fatal(err)
		}
		if v.Rows.Items == nil {
			if string(r.body) != `{"rows":{"items":null}}` {
				t.Fatalf("null row body %s", r.body)
			}
			nulls++
			continue
		}
		for _, it := range *v.Rows.Items {
			keys := slices.Sorted(mapKeys(it))
			want := []string{"basic_image", "bpm", "description", "id", "image", "image_wide_url", "ordering", "player_image", "spotlight_image", "thumbnail", "title", "wide_image"}
			i := slices.IndexFunc(cat.Genres[p.ID].Items, func(g sandbox.GenreItem) bool { return float64(g.ID) == it["id"].(float64) })
			if !slices.Equal(keys, want) || i < 0 || int(it["ordering"].(float64)) != cat.Genres[p.ID].Items[i].Ordering {
				t.Fatalf("genre item %v", it)
			}
		}
	}
	if nulls != 1 {
		t.Fatalf("%d rows with items: null, want 1", nulls)
	}
	// An unknown row id is not an empty row (TestGenreRowUnknownIDIsNotAnEmptyRow).
	wantEnvelope(t, a.do("GET", "/partners/genres/424242", tok, nil), 400, "no results for given type")
}

func TestEmptyCatalog(t *testing.T) {
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.EmptyCatalog = true })
	a := newAPI(t, sb)
	wantEnvelope(t, a.do("GET", "/partners/catalog", a.session(), nil), 400, "no catalogs available")
	wantEnvelope(t, a.do("GET", "/partners/catalog/restricted", a.session(), nil), 400, "no catalogs available")
	wantEnvelope(t, a.do("GET", "/partners/catalog/restricted", a.userSession(), nil), 400, "no catalogs available for this partner")
}

func TestRestrictedCatalog(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	cat := sb.Catalog()
	ids := func(r resp) []int64 {
		t.Helper()
		wantStatus(t, r, 200)
		var v struct {
			Catalogs []struct {
				PageID int64 `json:"page_id"`
			} `json:"catalogs"`
		}
		if err := json.Unmarshal(r.body, &v); err != nil {
			t.Fatal(err)
		}
		var out []int64
		for _, c := range v.Catalogs {
			out = append(out, c.PageID)
		}
		slices.Sort(out) // the wire order is shuffled in strict mode
		return out
	}
	pageIDs := func(ps []sandbox.Page) []int64 {
		var out []int64
		for _, p := range ps {
			out = append(out, p.ID)
		}
		slices.Sort(out)
		return out
	}
	all := pageIDs(cat.Pages)
	plain, user := a.session(), a.userSession()

	// Without partner identity: the unrestricted catalog, whatever the country.
	if got := ids(a.do("GET", "/partners/catalog/restricted", plain, nil, "EDGE-IPCountry", "DE")); !slices.Equal(got, all) {
		t.Fatalf("session token: %v, want %v", got, all)
	}
	noCountry := ids(a.do("GET", "/partners/catalog/restricted", user, nil))
	if want := pageIDs(cat.RestrictedPages("")); !slices.Equal(noCountry, want) || len(noCountry) >= len(all) {
		t.Fatalf("with-user, no country: %v, want %v (fewer than %d)", noCountry, want, len(all))
	}
	de := ids(a.do("GET", "/partners/catalog/restricted", user, nil, "EDGE-IPCountry", "DE"))
	if want := pageIDs(cat.RestrictedPages("DE")); !slices.Equal(de, want) || len(de) >= len(noCountry) {
		t.Fatalf("with-user DE: %v, want %v", de, want)
	}
	// Two letters of either case count; anything else is ignored.
	if got := ids(a.do("GET", "/partners/catalog/restricted", user, nil, "EDGE-IPCountry", "de")); !slices.Equal(got, de) {
		t.Fatalf("lowercase de: %v", got)
	}
	for _, bad := range []string{"DEU", "D", "D1", "  "} {
		if got := ids(a.do("GET", "/partners/catalog/restricted", user, nil, "EDGE-IPCountry", bad)); !slices.Equal(got, noCountry) {
			t.Fatalf("EDGE-IPCountry %q must be ignored: %v", bad, got)
		}
	}
	wantEnvelope(t, a.do("GET", "/partners/catalog/restricted", user, nil, "EDGE-IPCountry", "CN"), 400, "no catalogs available for this partner")
	// The header is read only by the restricted catalog.
	if got := ids(a.do("GET", "/partners/catalog", user, nil, "EDGE-IPCountry", "CN")); !slices.Equal(got, all) {
		t.Fatalf("plain catalog filtered by country: %v", got)
	}
}

func TestTinyAndLargeCatalogsKeepEveryFixture(t *testing.T) {
	for _, o := range []sandbox.Config{{Pages: 1, ListsPerPage: 1, MixesPerList: 1}, {Pages: 1, ListsPerPage: 2, MixesPerList: 1}, {Pages: 20, ListsPerPage: 10, MixesPerList: 10, Seed: 99}} {
		srv, err := sandbox.New(o)
		if err != nil {
			t.Fatal(err)
		}
		cat := srv.Catalog()
		for _, q := range []sandbox.ISRCQuirk{sandbox.QuirkLowercase, sandbox.QuirkHyphenated, sandbox.QuirkTrailingSpace, sandbox.QuirkShared, sandbox.QuirkEmpty} {
			tracks := cat.TracksWithQuirk(q)
			if len(tracks) == 0 {
				t.Fatalf("%+v: no %s track", o, q)
			}
			for _, tr := range tracks {
				if _, _, ok := cat.MixContaining(tr.ID); !ok {
					t.Fatalf("%+v: %s track %d in no mix", o, q, tr.ID)
				}
			}
		}
		if len(cat.Pages) != o.Pages+1 || len(cat.Mixes) != o.Pages*o.ListsPerPage*o.MixesPerList {
			t.Fatalf("%+v: %d pages, %d mixes", o, len(cat.Pages), len(cat.Mixes))
		}
	}
}
