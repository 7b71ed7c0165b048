model m {
  config { d = 8
