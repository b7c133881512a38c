// Package shopv1 is the shop.v1 contract of protocodec's examples and
// tests, generated from order.proto: a message another service
// publishes.
package shopv1

// The generated code of the contract, and of the two services of
// testdata that share it, each under its own Go package path:
//go:generate sh -c "cd .. && protoc --go_out=. --go_opt=paths=source_relative shopv1/order.proto"
//go:generate sh -c "cd ../testdata/shop && protoc --go_out=. --go_opt=paths=source_relative gen/shopv1/order.proto"
//go:generate sh -c "cd ../testdata/billing && protoc --go_out=. --go_opt=paths=source_relative contracts/orderspb/order.proto"
