package dedup

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// The hot statements take their batches as array parameters. pgx encodes a
// plain []string or [][]byte through an ArrayGetter whose Index returns each
// element as an interface value, and putting a string or a slice in an
// interface allocates: one allocation per element per column, on every
// hot statement. These array types hand pgx a
// pointer to each element instead (free to put in an interface); the bytes
// on the wire are the same binary arrays.

// textArray is a text[] parameter.
type textArray []string

// nullTextArray is a text[] parameter whose empty strings are NULL.
type nullTextArray []string

// int8Array is a bigint[] parameter (an int64 of 256 or more allocates in
// an interface too).
type int8Array []int64

// byteaArray is a bytea[] parameter; a nil element is NULL.
type byteaArray [][]byte

// timestamptzArray is a timestamptz[] parameter.
type timestamptzArray []time.Time

type textElem string

func (e *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*e), Valid: true}, nil
}

type int8Elem int64

func (e *int8Elem) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*e), Valid: true}, nil
}

type byteaElem []byte

func (e *byteaElem) BytesValue() ([]byte, error) { return *e, nil }

type timestamptzElem time.Time

func (e *timestamptzElem) TimestamptzValue() (pgtype.Timestamptz, error) {
	return pgtype.Timestamptz{Time: time.Time(*e), Valid: true}, nil
}

// dims is an array's one dimension, or nil (a NULL array) for a nil
// slice, as pgx's own FlatArray does.
func dims(n int, isNil bool) []pgtype.ArrayDimension {
	if isNil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}

func (a textArray) Dimensions() []pgtype.ArrayDimension { return dims(len(a), a == nil) }
func (a textArray) Index(i int) any                     { return (*textElem)(&a[i]) }
func (a textArray) IndexType() any                      { return (*textElem)(nil) }

func (a nullTextArray) Dimensions() []pgtype.ArrayDimension { return dims(len(a), a == nil) }
func (a nullTextArray) IndexType() any                      { return (*textElem)(nil) }
func (a nullTextArray) Index(i int) any {
	if a[i] == "" {
		return nil
	}
	return (*textElem)(&a[i])
}

func (a byteaArray) Dimensions() []pgtype.ArrayDimension { return dims(len(a), a == nil) }
func (a byteaArray) IndexType() any                      { return (*byteaElem)(nil) }
func (a byteaArray) Index(i int) any {
	if a[i] == nil {
		return nil
	}
	return (*byteaElem)(&a[i])
}

func (a int8Array) Dimensions() []pgtype.ArrayDimension { return dims(len(a), a == nil) }
func (a int8Array) Index(i int) any                     { return (*int8Elem)(&a[i]) }
func (a int8Array) IndexType() any                      { return (*int8Elem)(nil) }

func (a timestamptzArray) Dimensions() []pgtype.ArrayDimension { return dims(len(a), a == nil) }
func (a timestamptzArray) Index(i int) any                     { return (*timestamptzElem)(&a[i]) }
func (a timestamptzArray) IndexType() any                      { return (*timestamptzElem)(nil) }
