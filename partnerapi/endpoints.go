package partnerapi

import (
	"context"
	"fmt"
	"strconv"
)

// CatalogEntry is one element of `catalogs` (GET /partners/catalog and
// /partners/catalog/restricted).
type CatalogEntry struct {
	PageID    int64  `json:"page_id"`
	Title     string `json:"title"`
	Type      string `json:"type"`
	Ranking   int    `json:"ranking"`
	ListCount int    `json:"list_count"`
}

// ImageSet is the artwork of a page list or list.
type ImageSet struct {
	Thumbnail string `json:"thumbnail"`
	Large     string `json:"large"`
	Player    string `json:"player"`
}

// PageList is one list on a page. MixCount uses a broader filter than the
// list endpoint: the mixes List returns are authoritative.
type PageList struct {
	ListID      int64    `json:"list_id"`
	Ranking     int      `json:"ranking"`
	Title       string   `json:"title"`
	Description string   `json:"description"`
	MixCount    int      `json:"mix_count"`
	Image       ImageSet `json:"image"`
}

// Page is GET /partners/page/{id}. Lists are in display order: sorted by
// Ranking, ascending (the API may send them in any order).
type Page struct {
	ID    int64      `json:"id"`
	Title string     `json:"title"`
	Lists []PageList `json:"lists"`
}

// ListMixSummary is one mix of a list, decoded from either shape:
//
//   - live: id, title, description, length, explicit (0/1), bpm, max_bpm, list_id;
//   - standby: id, title, length, explicit (boolean), min_bpm, max_bpm,
//     image_large, image_thumbnail, dj.
//
// Fields absent from the shape that was served stay zero.
type ListMixSummary struct {
	ID             int64    `json:"id"`
	Title          string   `json:"title"`
	Description    string   `json:"description"` // live only
	Length         string   `json:"length"`      // HH:MM:SS
	Explicit       FlexBool `json:"explicit"`    // 0/1 live, boolean in standby
	BPM            int      `json:"bpm"`         // live only: representative BPM
	MinBPM         int      `json:"min_bpm"`     // standby only
	MaxBPM         int      `json:"max_bpm"`
	ListID         int64    `json:"list_id"`         // live only
	ImageLarge     string   `json:"image_large"`     // standby only
	ImageThumbnail string   `json:"image_thumbnail"` // standby only
	DJ             *DJ      `json:"dj"`              // standby only; nil when absent
}

// RepresentativeBPM is bpm when served (live), else the middle of
// min_bpm..max_bpm (standby), else max_bpm.
func (s ListMixSummary) RepresentativeBPM() int {
	switch {
	case s.BPM != 0:
		return s.BPM
	case s.MinBPM != 0 && s.MaxBPM != 0:
		return (s.MinBPM + s.MaxBPM) / 2
	}
	return s.MaxBPM
}

// List is GET /partners/list/{id}.
type List struct {
	ID          int64            `json:"id"`
	Ranking     int              `json:"ranking"`
	Title       string           `json:"title"`
	Description string           `json:"description"`
	Image       ImageSet         `json:"image"`
	Mixes       []ListMixSummary `json:"mixes"`
}

// GenreRowItem is one item of a genre row. In standby only ID, Title,
// Description, BPM, Image, Thumbnail, PlayerImage and Ordering are
// guaranteed.
type GenreRowItem struct {
	ID             int64  `json:"id"`
	Title          string `json:"title"`
	Description    string `json:"description"`
	BPM            int    `json:"bpm"`
	Image          string `json:"image"`
	ImageWideURL   string `json:"image_wide_url"`
	PlayerImage    string `json:"player_image"`
	Thumbnail      string `json:"thumbnail"`
	BasicImage     string `json:"basic_image"`
	WideImage      string `json:"wide_image"`
	SpotlightImage string `json:"spotlight_image"`
	Ordering       int    `json:"ordering"`
}

// GenreRow is GET /partners/genres/{id}: `rows`. Items is nil when the API
// answered `items: null` (the row exists but has no items); otherwise they
// are in display order: sorted by Ordering, ascending (the API may send them
// in any order). An unknown row id is an *Error of KindRejected (400).
type GenreRow struct {
	Items []GenreRowItem `json:"items"`
}

// Catalog is GET /partners/catalog: the pages (music rows), not filtered by
// country, in display order: sorted by Ranking, ascending (the API may send
// them in any order).
func (c *Client) Catalog(ctx context.Context) ([]CatalogEntry, Meta, error) {
	return getDecoded(ctx, c, EndpointCatalog, PathCatalog, c.main, "", decodeCatalog)
}

// RestrictedCatalog is GET /partners/catalog/restricted: the catalog filtered
// by the content restrictions of the partner account. With an Email
// configured the call uses a token from POST /partners/session/with-user (the
// partner identity); without one, the API falls back to the unrestricted
// catalog. country, when not empty, is sent as EDGE-IPCountry and must be two
// ASCII letters (ISO 3166-1 alpha-2). Entries are sorted by Ranking, as
// Catalog's are.
func (c *Client) RestrictedCatalog(ctx context.Context, country string) ([]CatalogEntry, Meta, error) {
	if country != "" && !isAlpha2(country) {
		return nil, Meta{}, fmt.Errorf("partnerapi: RestrictedCatalog: country %q is not two ASCII letters (ISO 3166-1 alpha-2)", bound(country, 16))
	}
	s := c.main
	if c.cfg.Credentials.Email != "" {
		s = c.user
	}
	return getDecoded(ctx, c, EndpointRestrictedCatalog, PathRestrictedCatalog, s, country, decodeCatalog)
}

func isAlpha2(s string) bool {
	if len(s) != 2 {
		return false
	}
	for i := 0; i < 2; i++ {
		if b := s[i] | 0x20; b < 'a' || b > 'z' {
			return false
		}
	}
	return true
}

// Page is GET /partners/page/{id}.
func (c *Client) Page(ctx context.Context, id int64) (Page, Meta, error) {
	return getDecoded(ctx, c, EndpointPage, PathPage+strconv.FormatInt(id, 10), c.main, "", decodePage)
}

// List is GET /partners/list/{id}; its mix summaries are decoded from the
// live or the standby shape.
func (c *Client) List(ctx context.Context, id int64) (List, Meta, error) {
	return getDecoded(ctx, c, EndpointList, PathList+strconv.FormatInt(id, 10), c.main, "", decodeList)
}

// GenreRow is GET /partners/genres/{id} (same id space as page ids).
func (c *Client) GenreRow(ctx context.Context, id int64) (GenreRow, Meta, error) {
	return getDecoded(ctx, c, EndpointGenres, PathGenres+strconv.FormatInt(id, 10), c.main, "", decodeGenreRow)
}

// Mix is GET /partners/mix/{id}. An unknown mix is an *Error of KindNotFound.
// In standby (Meta.Standby()) the metadata may be degraded: see Mix.
func (c *Client) Mix(ctx context.Context, id int64) (Mix, Meta, error) {
	return getDecoded(ctx, c, EndpointMix, PathMix+strconv.FormatInt(id, 10), c.main, "", decodeMix)
}

// getDecoded is a GET of path (endpoint ep) (c.get: session s, country header) whose
// answer decode turns into the endpoint's value.
func getDecoded[T any](ctx context.Context, c *Client, ep Endpoint, path string, s *slot, country string, decode func([]byte) (T, error)) (T, Meta, error) {
	var out T
	meta, err := c.get(ctx, ep, path, s, country, func(b []byte) (err error) {
		out, err = decode(b)
		return err
	})
	return out, meta, err
}
