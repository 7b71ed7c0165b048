model m {
  config { batch = 8 }
}
