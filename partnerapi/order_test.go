package partnerapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// TestCatalogHelpersSortByRank: the API answers every ranked collection
// shuffled, with gapped ranks that do not follow the ids; the client returns
// them in display order (ranking / ordering ascending, ties in wire order).
func TestCatalogHelpersSortByRank(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, PathRestrictedCatalog), strings.HasPrefix(r.URL.Path, PathCatalog):
			fmt.Fprint(w, `{"catalogs":[{"page_id":7,"ranking":40},{"page_id":3,"ranking":12},{"page_id":9,"ranking":5},{"page_id":1,"ranking":33}]}`)
		case strings.HasPrefix(r.URL.Path, PathPage):
			fmt.Fprint(w, `{"page":{"id":7,"lists":[{"list_id":20,"ranking":9},{"list_id":11,"ranking":2},{"list_id":15,"ranking":9},{"list_id":30,"ranking":4}]}}`)
		case strings.HasPrefix(r.URL.Path, PathGenres):
			fmt.Fprint(w, `{"rows":{"items":[{"id":5,"ordering":8},{"id":2,"ordering":3},{"id":9,"ordering":21},{"id":1,"ordering":13}]}}`)
		default:
			http.NotFound(w, r)
		}
	})
	c := f.client(t, nil)
	ctx := context.Background()
	cat, _, err := c.Catalog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := pageIDs(cat); !slices.Equal(got, []int64{9, 3, 1, 7}) {
		t.Fatalf("catalog order %v, want by ranking 9,3,1,7", got)
	}
	rcat, _, err := c.RestrictedCatalog(ctx, "DE")
	if err != nil {
		t.Fatal(err)
	}
	if got := pageIDs(rcat); !slices.Equal(got, []int64{9, 3, 1, 7}) {
		t.Fatalf("restricted catalog order %v", got)
	}
	p, _, err := c.Page(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	var lists []int64
	for _, l := range p.Lists {
		lists = append(lists, l.ListID)
	}
	if !slices.Equal(lists, []int64{11, 30, 20, 15}) { // 20 and 15 tie: wire order kept
		t.Fatalf("page lists %v, want by ranking 11,30,20,15", lists)
	}
	row, _, err := c.GenreRow(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	var items []int64
	for _, it := range row.Items {
		items = append(items, it.ID)
	}
	if !slices.Equal(items, []int64{2, 5, 1, 9}) {
		t.Fatalf("genre row %v, want by ordering 2,5,1,9", items)
	}
}

func pageIDs(cat []CatalogEntry) []int64 {
	var out []int64
	for _, e := range cat {
		out = append(out, e.PageID)
	}
	return out
}
