-- ARGV: P, rid
drop_waiter(ARGV[2])
return 1
