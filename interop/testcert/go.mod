module ferry.invalid/interop/testcert

go 1.26.8
