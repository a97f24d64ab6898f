module e31.example/wc

go 1.25
