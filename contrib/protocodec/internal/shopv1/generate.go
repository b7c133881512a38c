package shopv1

// The generated code of the tests' contract, and of the two services of
// testdata that share it, each under its own Go package path:
//go:generate sh -c "cd ../.. && protoc --go_out=. --go_opt=paths=source_relative internal/shopv1/order.proto"
//go:generate sh -c "cd ../../testdata/shop && protoc --go_out=. --go_opt=paths=source_relative gen/shopv1/order.proto"
//go:generate sh -c "cd ../../testdata/billing && protoc --go_out=. --go_opt=paths=source_relative contracts/orderspb/order.proto"
