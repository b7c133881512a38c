// Package benchpb holds the generated code of the bench's order as a
// Protocol Buffers message (order.proto).
package benchpb

//go:generate sh -c "cd ../.. && protoc --go_out=. --go_opt=paths=source_relative internal/benchpb/order.proto"
