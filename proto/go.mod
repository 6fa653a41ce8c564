module github.com/peerpods/peerpods-controllers/proto

// The Go version and grpc-go/protobuf releases cloud-api-adaptor builds with (its go.mod), so
// CAA can import this client without upgrading either. `make proto-go-test` builds and tests the
// client with exactly this Go release (GOTOOLCHAIN).
go 1.25.0

require (
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250804133106-a7a43d27e69b
	google.golang.org/grpc v1.76.0
	google.golang.org/protobuf v1.36.11
)

require (
	golang.org/x/net v0.42.0 // indirect
	golang.org/x/sys v0.34.0 // indirect
	golang.org/x/text v0.27.0 // indirect
)
