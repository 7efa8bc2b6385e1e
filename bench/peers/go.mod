module ginza/bench/peers

go 1.22
