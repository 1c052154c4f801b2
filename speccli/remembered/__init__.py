"""What is kept between processes: stores of earlier replies, what `--k auto` learnt."""
