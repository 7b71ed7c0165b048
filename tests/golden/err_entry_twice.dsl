model m {
  config { d = 8  d = 9 }
}
